//! Host names to services: `SERVICE`, `SERVICE.GROUP` or `SERVICE.GROUP.NAMESPACE`.
//!
//! A request names its service by its host: the authority of an absolute URI (a client using
//! the proxy as its `http_proxy`) or the `Host` header (`:authority` in HTTP/2); a port is
//! ignored. Missing parts come from the config's defaults. A service whose name holds dots
//! (`com.example.Orders`) is reached through an alias: a `[services.orders]` table with
//! `service = "com.example.Orders"` (see [`Routing::route`](crate::config::Routing::route)).
//!
//! Many HTTP clients lower-case host names (they are case-insensitive in DNS), while registry
//! names are not: a group or namespace part that equals the default one but for case is read
//! as the default (`orders.default_group` is `DEFAULT_GROUP`); other upper-case names need an
//! alias table.

use gangway_core::model::ServiceKey;
use http::uri::Authority;

/// The host of a request: the URI's authority (absolute-form `GET http://orders/x`, or
/// HTTP/2's `:authority`), else the `Host` header; without the port. A `Host` header that
/// disagrees with an absolute URI is ignored, as RFC 9112 §3.2.2 asks of a proxy.
///
/// # Errors
/// A one-line reason when neither is present, when there is more than one `Host` header
/// (RFC 9112 §3.2: 400), or when the `Host` header is not an authority.
pub fn request_host<B>(request: &http::Request<B>) -> Result<String, String> {
    let mut hosts = request.headers().get_all(http::header::HOST).iter();
    let header = hosts.next();
    if hosts.next().is_some() {
        return Err("more than one Host header: send exactly one".to_owned());
    }
    if let Some(authority) = request.uri().authority() {
        return Ok(authority.host().to_owned());
    }
    let header =
        header.ok_or("no host: send an absolute URI (http://SERVICE/path) or a Host header")?;
    let text = header
        .to_str()
        .map_err(|_| "the Host header is not ASCII".to_owned())?;
    let authority: Authority = text
        .parse()
        .map_err(|_| format!("the Host header {text:?} is not HOST[:PORT]"))?;
    Ok(authority.host().to_owned())
}

/// The service `host` names: `SERVICE`, `SERVICE.GROUP` or `SERVICE.GROUP.NAMESPACE`, the
/// missing parts being `namespace` and `group`.
///
/// # Errors
/// A one-line reason naming the part that is wrong: more than three parts, or a part that is
/// not a valid name (1-128 letters, digits, `_`, `-`, `:`).
pub fn service_key(host: &str, namespace: &str, group: &str) -> Result<ServiceKey, String> {
    let parts: Vec<&str> = host.split('.').collect();
    let (service, group, namespace) = match parts.as_slice() {
        [s] => (*s, group, namespace),
        [s, g] => (*s, same_or(g, group), namespace),
        [s, g, n] => (*s, same_or(g, group), same_or(n, namespace)),
        _ => {
            return Err(format!(
                "host {host:?} has {} dot-separated parts; expected SERVICE, SERVICE.GROUP or \
                 SERVICE.GROUP.NAMESPACE",
                parts.len()
            ));
        }
    };
    for (field, value) in [
        ("service", service),
        ("group", group),
        ("namespace", namespace),
    ] {
        gangway_core::validate::name(field, value)
            .map_err(|e| format!("host {host:?}: {field} {}", e.message))?;
    }
    Ok(ServiceKey::new(namespace, group, service))
}

/// `default` when `part` is it but for ASCII case, else `part`.
fn same_or<'a>(part: &'a str, default: &'a str) -> &'a str {
    if part.eq_ignore_ascii_case(default) {
        default
    } else {
        part
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_two_or_three_parts() {
        assert_eq!(
            service_key("orders", "public", "DEFAULT_GROUP").unwrap(),
            ServiceKey::new("public", "DEFAULT_GROUP", "orders")
        );
        assert_eq!(
            service_key("orders.shop", "public", "DEFAULT_GROUP").unwrap(),
            ServiceKey::new("public", "shop", "orders")
        );
        assert_eq!(
            service_key("orders.shop.prod", "public", "DEFAULT_GROUP").unwrap(),
            ServiceKey::new("prod", "shop", "orders")
        );
    }

    #[test]
    fn a_lower_cased_default_group_or_namespace_is_the_default() {
        // reqwest, browsers and the url crate send `Host: orders.default_group.public`.
        assert_eq!(
            service_key("orders.default_group.PUBLIC", "public", "DEFAULT_GROUP").unwrap(),
            ServiceKey::new("public", "DEFAULT_GROUP", "orders")
        );
        assert_eq!(
            service_key("orders.shop", "public", "SHOP").unwrap().group,
            "SHOP"
        );
        assert_eq!(
            service_key("orders.other", "public", "DEFAULT_GROUP")
                .unwrap()
                .group,
            "other",
            "other names keep their case"
        );
    }

    #[test]
    fn bad_hosts_say_which_part_is_wrong() {
        let e = service_key("127.0.0.1", "public", "G").unwrap_err();
        assert!(e.contains("4 dot-separated parts"), "{e}");
        let e = service_key("orders..prod", "public", "G").unwrap_err();
        assert!(e.contains("group must not be empty"), "{e}");
        let e = service_key("", "public", "G").unwrap_err();
        assert!(e.contains("service must not be empty"), "{e}");
    }

    #[test]
    fn the_host_comes_from_the_uri_then_the_header_without_port() {
        let absolute = http::Request::get("http://orders:8080/x")
            .header("host", "other")
            .body(())
            .unwrap();
        assert_eq!(request_host(&absolute).unwrap(), "orders");
        let origin = http::Request::get("/x")
            .header("host", "orders.shop:80")
            .body(())
            .unwrap();
        assert_eq!(request_host(&origin).unwrap(), "orders.shop");
        let none = http::Request::get("/x").body(()).unwrap();
        assert!(request_host(&none).unwrap_err().starts_with("no host"));
        let bad = http::Request::get("/x")
            .header("host", "a b")
            .body(())
            .unwrap();
        assert!(request_host(&bad).is_err());
    }

    #[test]
    fn two_host_headers_are_refused_in_either_form() {
        for uri in ["/x", "http://orders/x"] {
            let twice = http::Request::get(uri)
                .header("host", "orders")
                .header("host", "payments")
                .body(())
                .unwrap();
            let e = request_host(&twice).unwrap_err();
            assert!(e.contains("more than one Host header"), "{uri}: {e}");
        }
    }
}
