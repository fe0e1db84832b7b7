'use strict';
// Drives the published npm `nacos` client (v1 HTTP: register, beats, list polling) against a
// running gangway server.
//
//   node scenarios.js basic  HTTP_ADDR SERVICE TTL_MS   # asserts; exit 1 on the first failure
//   node scenarios.js holder HTTP_ADDR SERVICE IP PORT  # registers, prints READY, keeps beating
//
// `basic`: register two instances, beats keep them healthy past the server's lease TTL, the
// client's list and a polling subscription see them, a deregistration reaches the subscription,
// deregister the last one. The server-side view is read with plain HTTP GETs of the v1 list.

const http = require('http');
const { NacosNamingClient } = require('nacos');

const quiet = {
  info() {}, debug() {}, warn() {},
  error(e) { process.stderr.write(`nacos client error: ${e && e.message ? e.message : e}\n`); },
};

function say(line) { process.stdout.write(line + '\n'); }
function fail(msg) { say(`FAIL node nacos ${msg}`); process.exit(1); }
const sleep = ms => new Promise(r => setTimeout(r, ms));

function serverList(addr, service) {
  const url = `http://${addr}/nacos/v1/ns/instance/list?serviceName=${encodeURIComponent(service)}`;
  return new Promise((resolve, reject) => {
    http.get(url, res => {
      let body = '';
      res.on('data', c => { body += c; });
      res.on('end', () => {
        try { resolve(JSON.parse(body)); } catch (e) { reject(new Error(`${res.statusCode} ${body}`)); }
      });
    }).on('error', reject);
  });
}

async function client(addr) {
  const c = new NacosNamingClient({ logger: quiet, serverList: addr, namespace: 'public' });
  await c.ready();
  return c;
}

async function basic(addr, service, ttlMs) {
  const c = await client(addr);
  const a = { ip: '10.4.0.1', port: 7001 };
  const b = { ip: '10.4.0.2', port: 7002 };
  const t0 = Date.now();
  await c.registerInstance(service, a);
  await c.registerInstance(service, b);
  const hosts = (await c.getAllInstances(service)).map(h => `${h.ip}:${h.port}`).sort();
  if (hosts.join() !== '10.4.0.1:7001,10.4.0.2:7002') fail(`getAllInstances after register: ${hosts}`);
  say('ok register two instances, getAllInstances lists both');

  // Beats: the client's first beat comes after its 10 s initial delay, then every
  // clientBeatInterval; both instances must stay healthy past the TTL.
  const until = t0 + Number(ttlMs) + 4000;
  let checks = 0;
  while (Date.now() < until) {
    const info = await serverList(addr, service);
    const healthy = info.hosts.filter(h => h.healthy).length;
    if (info.hosts.length !== 2 || healthy !== 2) {
      fail(`at ${Date.now() - t0} ms: ${info.hosts.length} listed, ${healthy} healthy (TTL ${ttlMs} ms)`);
    }
    checks += 1;
    await sleep(500);
  }
  say(`ok beats kept both healthy for ${Date.now() - t0} ms (TTL ${ttlMs} ms, ${checks} checks)`);

  const changes = [];
  c.subscribe({ serviceName: service }, list => {
    changes.push({ t: Date.now(), hosts: list.map(h => `${h.ip}:${h.port}`).sort().join() });
  });
  const deadline = Date.now() + 15000;
  while (!changes.some(ch => ch.hosts === '10.4.0.1:7001,10.4.0.2:7002')) {
    if (Date.now() > deadline) fail(`subscription never listed both: ${JSON.stringify(changes)}`);
    await sleep(50);
  }
  const t1 = Date.now();
  await c.deregisterInstance(service, b);
  while (!changes.some(ch => ch.t >= t1 && ch.hosts === '10.4.0.1:7001')) {
    if (Date.now() > t1 + 15000) fail(`subscription did not see the deregistration: ${JSON.stringify(changes)}`);
    await sleep(50);
  }
  say(`ok polling subscription saw the deregistration after ${Date.now() - t1} ms (cacheMillis 10000)`);

  await c.deregisterInstance(service, a);
  const left = await serverList(addr, service);
  if (left.hosts.length !== 0) fail(`after deregistering both: ${JSON.stringify(left.hosts)}`);
  say('ok deregister: the server lists nothing');
  await c.close();
  say('PASS node nacos basic');
  process.exit(0);
}

async function holder(addr, service, ip, port) {
  const c = await client(addr);
  await c.registerInstance(service, { ip, port: Number(port) });
  say('READY');
  setInterval(() => {}, 1 << 30);
}

const [mode, ...args] = process.argv.slice(2);
const run = { basic, holder }[mode];
if (!run) fail(`unknown mode ${mode}`);
run(...args).catch(e => fail(e.stack || String(e)));
