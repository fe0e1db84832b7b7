//! Input generation: random bytes, and structure-aware mutations of valid inputs (JSON values,
//! form pairs, strings) so that parsers get past their first byte.
//!
//! Everything draws from one seeded [`StdRng`]: a run is reproducible from its seed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Map, Number, Value, json};

/// Strings that have broken parsers before: empty, whitespace, separators, escapes, numbers at
/// their bounds, odd Unicode, path tricks.
const NASTY: &[&str] = &[
    "",
    " ",
    "\t\n",
    "=",
    "&",
    ":",
    "[",
    "]",
    "[]",
    "[::1]",
    "[::1]:",
    "::",
    ".",
    "..",
    "/",
    "%",
    "%zz",
    "%00",
    "\0",
    "\u{7f}",
    "\u{feff}",
    "\u{202e}",
    "é",
    "😀",
    "\u{10ffff}",
    "0",
    "-0",
    "-1",
    "1e309",
    "NaN",
    "inf",
    "-inf",
    "0.0001",
    "10001",
    "65535",
    "65536",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "9223372036854775807",
    "0x10",
    "true",
    "false",
    "null",
    "{}",
    "[]",
    "{\"a\":",
    "\"",
    "\\",
    "\\u0000",
    "a=b=c",
    "k=",
    "=v",
    "127.0.0.9:80",
    "1.2.3.4:0",
    "256.1.1.1:80",
    "host:80",
    "[::1]:80",
    "[fe80::1%eth0]:80",
    "http://x:1/",
    "https://x:1",
    "127.0.0.1",
    "preserved.heart.beat.timeout",
    "preserved.ip.delete.timeout",
    "preserved.heart.beat.interval",
    "public",
    "DEFAULT_GROUP",
    "DEFAULT",
    "orders",
    "DEFAULT_GROUP@@orders",
    "@@",
    "a@@b@@c",
    "1ms",
    "0s",
    "3s",
    "2m",
    "99999999999h",
];

/// The mutation engine.
pub struct Gen {
    rng: StdRng,
}

impl Gen {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The underlying random source.
    pub fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }

    /// A random `u32`, biased to its bounds.
    pub fn rng_u32(&mut self) -> u32 {
        match self.below(4) {
            0 => *self.pick(&[0, 1, 65_535, 65_536, u32::MAX]),
            _ => self.rng.random(),
        }
    }

    /// A random `u64`, biased to its bounds.
    pub fn rng_u64(&mut self) -> u64 {
        match self.below(4) {
            0 => *self.pick(&[0, 1, 2, u64::MAX]),
            _ => self.rng.random(),
        }
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n)
    }

    /// One of `items`.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Random bytes, mostly short, sometimes up to `max`.
    pub fn bytes(&mut self, max: usize) -> Vec<u8> {
        let len = if self.chance(0.9) {
            self.below(64.min(max) + 1)
        } else {
            self.below(max + 1)
        };
        (0..len).map(|_| self.rng.random()).collect()
    }

    /// An odd string: a nasty one, random Unicode, random ASCII, a long run, or a splice.
    pub fn string(&mut self) -> String {
        match self.below(8) {
            0..=2 => (*self.pick(NASTY)).to_owned(),
            3 => {
                let len = self.below(16);
                (0..len)
                    .map(|_| {
                        char::from_u32(self.rng.random_range(0..0x11_0000)).unwrap_or('\u{fffd}')
                    })
                    .collect()
            }
            4 => {
                let len = self.below(24);
                (0..len)
                    .map(|_| char::from(self.rng.random_range(0x20u8..0x7f)))
                    .collect()
            }
            5 => {
                let unit = (*self.pick(&["a", "é", "%", "\\", "[", "."])).to_owned();
                unit.repeat(*self.pick(&[127, 128, 129, 256, 4096, 16_385, 70_000]))
            }
            6 => format!("{}{}", self.pick(NASTY), self.pick(NASTY)),
            _ => String::from_utf8_lossy(&self.bytes(32)).into_owned(),
        }
    }

    /// An odd JSON value of any type, nested at most `depth` deep.
    pub fn value(&mut self, depth: u32) -> Value {
        match self.below(if depth == 0 { 7 } else { 9 }) {
            0 => Value::Null,
            1 => Value::Bool(self.chance(0.5)),
            2 => json!(*self.pick(&[
                0i64,
                -1,
                1,
                255,
                256,
                65_535,
                65_536,
                i64::from(i32::MAX),
                i64::from(u32::MAX),
                i64::MAX,
                i64::MIN
            ])),
            3 => json!(*self.pick(&[u64::MAX, 1u64 << 53, (1u64 << 53) + 1])),
            4 => Number::from_f64(*self.pick(&[
                0.0,
                -0.0,
                0.0005,
                0.001,
                0.5,
                1.5,
                10_000.0,
                10_000.5,
                1e300,
                -1e300,
                f64::MIN_POSITIVE,
            ]))
            .map_or(Value::Null, Value::Number),
            5 | 6 => Value::String(self.string()),
            7 => {
                let n = self.below(4);
                Value::Array((0..n).map(|_| self.value(depth - 1)).collect())
            }
            _ => {
                let n = self.below(4);
                let mut m = Map::new();
                for _ in 0..n {
                    let k = self.string();
                    let v = self.value(depth - 1);
                    m.insert(k, v);
                }
                Value::Object(m)
            }
        }
    }

    /// Mutates `v` in place, one to three times: replaces a node with an odd value, removes or
    /// adds a key, duplicates a node elsewhere, or changes a number or string slightly.
    pub fn mutate_json(&mut self, v: &mut Value) {
        for _ in 0..=self.below(3) {
            self.mutate_node(v, 0);
        }
    }

    fn mutate_node(&mut self, v: &mut Value, depth: u32) {
        // Descend into a child with some probability, else mutate here.
        let descend = depth < 4 && self.chance(0.6);
        match v {
            Value::Object(m) if descend && !m.is_empty() => {
                let i = self.below(m.len());
                if let Some((_, child)) = m.iter_mut().nth(i) {
                    return self.mutate_node(child, depth + 1);
                }
            }
            Value::Array(a) if descend && !a.is_empty() => {
                let i = self.below(a.len());
                return self.mutate_node(&mut a[i], depth + 1);
            }
            _ => {}
        }
        match (self.below(6), &mut *v) {
            (0, Value::Object(m)) if !m.is_empty() => {
                let i = self.below(m.len());
                if let Some(k) = m.keys().nth(i).cloned() {
                    m.remove(&k);
                }
            }
            (1, Value::Object(m)) => {
                let k = self.string();
                let val = self.value(2);
                m.insert(k, val);
            }
            (2, Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(0.0);
                let d = *self.pick(&[-1.0, 1.0, -0.5, 0.5, 1e-9]);
                *v = Number::from_f64(x + d).map_or(Value::Null, Value::Number);
            }
            (2, Value::String(s)) => {
                let extra = self.string();
                if self.chance(0.5) {
                    s.push_str(&extra);
                } else {
                    s.insert_str(0, &extra);
                }
            }
            _ => *v = self.value(2),
        }
    }

    /// Mutates bytes in place: flips, inserts, deletes, truncates, splices a nasty string.
    pub fn mutate_bytes(&mut self, b: &mut Vec<u8>) {
        for _ in 0..=self.below(4) {
            let len = b.len();
            match self.below(6) {
                0 if len > 0 => {
                    let i = self.below(len);
                    b[i] ^= 1 << self.below(8);
                }
                1 => {
                    let i = self.below(len + 1);
                    let x = self.rng.random();
                    b.insert(i, x);
                }
                2 if len > 0 => {
                    let i = self.below(len);
                    let n = self.below(len - i).max(1);
                    b.drain(i..i + n);
                }
                3 if len > 0 => {
                    let n = self.below(len);
                    b.truncate(n);
                }
                4 => {
                    let i = self.below(len + 1);
                    let s = self.pick(NASTY).as_bytes().to_vec();
                    b.splice(i..i, s);
                }
                _ if len > 0 => {
                    let i = self.below(len);
                    b[i] = *self.pick(&[0, 0xff, b'"', b'{', b'}', b'&', b'=', b'%', 0x80]);
                }
                _ => b.push(self.rng.random()),
            }
        }
    }

    /// Mutates form pairs: replaces a value or key, removes or duplicates a pair, adds an odd one.
    pub fn mutate_pairs(&mut self, pairs: &mut Vec<(String, String)>, names: &[&str]) {
        for _ in 0..=self.below(3) {
            let len = pairs.len();
            match self.below(6) {
                0 | 1 if len > 0 => {
                    let i = self.below(len);
                    pairs[i].1 = self.string();
                }
                2 if len > 0 => {
                    let i = self.below(len);
                    pairs.remove(i);
                }
                3 if len > 0 => {
                    let i = self.below(len);
                    let mut p = pairs[i].clone();
                    p.1 = self.string();
                    pairs.push(p);
                }
                4 => {
                    let k = (*self.pick(names)).to_owned();
                    let v = self.string();
                    pairs.push((k, v));
                }
                _ => {
                    let k = self.string();
                    let v = self.string();
                    pairs.push((k, v));
                }
            }
        }
    }

    /// Encodes pairs as `application/x-www-form-urlencoded`, or now and then raw (unescaped), so
    /// that the decoder sees stray `%`, `&` and `=` too.
    pub fn encode_pairs(&mut self, pairs: &[(String, String)]) -> String {
        if self.chance(0.1) {
            return pairs
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("&");
        }
        let mut s = form_urlencoded::Serializer::new(String::new());
        for (k, v) in pairs {
            s.append_pair(k, v);
        }
        s.finish()
    }

    /// Percent-encodes a path segment (all but unreserved characters).
    pub fn segment(&mut self, s: &str) -> String {
        let mut out = String::new();
        for b in s.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~:@".contains(&b) {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    }
}
