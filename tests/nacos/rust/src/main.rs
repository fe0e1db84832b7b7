//! Drives the published `nacos-sdk` of the Rust crates registry (gRPC) against gangway:
//! `gangway-nacos-rust-check HTTP_ADDR GRPC_PORT SERVICE`.
//!
//! A consumer subscribes to SERVICE; a provider (a second client, so a second connection)
//! registers two instances with one batch; the consumer must be pushed both; the provider
//! deregisters one and the consumer must be pushed the list without it; the service list must
//! hold SERVICE. Then prints HOLD and keeps both connections until stdin closes. Prints one line
//! per step with the time it took; exits 1 on the first failure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nacos_sdk::api::naming::{
    NamingChangeEvent, NamingEventListener, NamingService, NamingServiceBuilder, ServiceInstance,
};
use nacos_sdk::api::props::ClientProps;
use tokio::sync::mpsc;

const GROUP: &str = "DEFAULT_GROUP";
const STEP_TIMEOUT: Duration = Duration::from_secs(20);

struct Events(mpsc::UnboundedSender<Vec<String>>);

impl NamingEventListener for Events {
    fn event(&self, event: Arc<NamingChangeEvent>) {
        let mut addrs: Vec<String> = event
            .instances
            .clone()
            .unwrap_or_default()
            .iter()
            .map(|i| i.ip_and_port())
            .collect();
        addrs.sort();
        let _ = self.0.send(addrs);
    }
}

fn fail(msg: String) -> ! {
    eprintln!("FAIL rust nacos-sdk: {msg}");
    std::process::exit(1);
}

async fn client(addr: &str, grpc_port: u16, app: &str) -> NamingService {
    let props = ClientProps::new()
        .server_addr(addr)
        .remote_grpc_port(grpc_port)
        .namespace("")
        .app_name(app)
        .naming_load_cache_at_start(false);
    match NamingServiceBuilder::new(props).build().await {
        Ok(s) => s,
        Err(e) => fail(format!("build naming service: {e:?}")),
    }
}

async fn wait_for(rx: &mut mpsc::UnboundedReceiver<Vec<String>>, want: &[String]) -> Duration {
    let start = Instant::now();
    loop {
        match tokio::time::timeout_at((start + STEP_TIMEOUT).into(), rx.recv()).await {
            Ok(Some(got)) if got == want => return start.elapsed(),
            Ok(Some(got)) => println!("  (push {got:?}, waiting for {want:?})"),
            Ok(None) => fail("listener channel closed".into()),
            Err(_) => fail(format!("no push with {want:?} within {STEP_TIMEOUT:?}")),
        }
    }
}

fn instance(ip: &str, port: i32) -> ServiceInstance {
    ServiceInstance {
        ip: ip.to_owned(),
        port,
        weight: 1.0,
        healthy: true,
        enabled: true,
        ephemeral: true,
        ..Default::default()
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        fail("usage: gangway-nacos-rust-check HTTP_ADDR GRPC_PORT SERVICE".into());
    }
    let (addr, service) = (&args[1], args[3].clone());
    let grpc_port: u16 = args[2]
        .parse()
        .unwrap_or_else(|_| fail("bad GRPC_PORT".into()));
    let group = Some(GROUP.to_owned());

    let consumer = client(addr, grpc_port, "rust-consumer").await;
    let provider = client(addr, grpc_port, "rust-provider").await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let t = Instant::now();
    if let Err(e) = consumer
        .subscribe(
            service.clone(),
            group.clone(),
            Vec::new(),
            Arc::new(Events(tx)),
        )
        .await
    {
        fail(format!("subscribe: {e:?}"));
    }
    println!("ok subscribe ({} ms)", t.elapsed().as_millis());

    let a = instance("10.9.0.1", 7001);
    let b = instance("10.9.0.2", 7002);
    let t = Instant::now();
    if let Err(e) = provider
        .batch_register_instance(service.clone(), group.clone(), vec![a.clone(), b.clone()])
        .await
    {
        fail(format!("batch register: {e:?}"));
    }
    let want = vec![a.ip_and_port(), b.ip_and_port()];
    let pushed = wait_for(&mut rx, &want).await;
    println!(
        "ok register 2 instances, consumer pushed both ({} ms after the call)",
        (t.elapsed()).as_millis().max(pushed.as_millis())
    );

    match consumer
        .get_all_instances(service.clone(), group.clone(), Vec::new(), false)
        .await
    {
        Ok(list) if list.len() == 2 => println!("ok get_all_instances: 2"),
        Ok(list) => fail(format!("get_all_instances: {} instances", list.len())),
        Err(e) => fail(format!("get_all_instances: {e:?}")),
    }

    let t = Instant::now();
    if let Err(e) = provider
        .deregister_instance(service.clone(), group.clone(), a.clone())
        .await
    {
        fail(format!("deregister: {e:?}"));
    }
    wait_for(&mut rx, &[b.ip_and_port()]).await;
    println!(
        "ok deregister one, consumer pushed the rest ({} ms)",
        t.elapsed().as_millis()
    );

    match consumer.get_service_list(1, 100, group.clone()).await {
        Ok((names, _)) if names.contains(&service) => println!("ok service list holds {service}"),
        Ok((names, _)) => fail(format!("service list {names:?} lacks {service}")),
        Err(e) => fail(format!("service list: {e:?}")),
    }
    // Hold the connections until stdin closes, so the runner can read the subscriber table
    // (the consumer's acks) while the consumer is still connected.
    println!("HOLD");
    let mut line = String::new();
    let _ = tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut line)).await;
    drop((consumer, provider));
    println!("PASS rust nacos-sdk 0.8.3");
    std::process::exit(0);
}
