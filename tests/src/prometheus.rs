//! A real Prometheus server (Debian's `prometheus` package) for the agent
//! test: its own process in a test namespace, its own configuration and
//! storage in a temp dir; never the package's service. Scrapes one target
//! every second; PromQL through its HTTP API.

use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

use crate::agent::http_get;
use crate::netns::NsHandle;
use crate::tmp::TempDir;

/// Where Prometheus listens, in the namespace it runs in.
pub const PROMETHEUS_LISTEN: &str = "127.0.0.1:9090";

/// The scrape job of the target.
pub const JOB: &str = "ebpf-portmap";

pub struct Prometheus {
    child: Child,
    ns: NsHandle,
    listen: SocketAddr,
    dir: TempDir,
}

impl Prometheus {
    /// Starts Prometheus in `ns`, scraping `target` every second, and waits
    /// until it is ready.
    pub fn start(ns: &NsHandle, target: SocketAddr) -> Prometheus {
        let dir = TempDir::new("prometheus");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log file");
        let child = ns
            .command("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={PROMETHEUS_LISTEN}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start prometheus (apt-get install prometheus): {e}"));
        let mut prometheus = Prometheus {
            child,
            ns: ns.clone(),
            listen: PROMETHEUS_LISTEN.parse().expect("an address"),
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = prometheus.child.try_wait() {
                panic!("prometheus exited with {status}:\n{}", prometheus.log());
            }
            if matches!(
                http_get(&prometheus.ns, prometheus.listen, "/-/ready"),
                Ok((200, _))
            ) {
                return prometheus;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within 30 s:\n{}",
                prometheus.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The result vector of the instant query `promql` (`data.result`).
    pub fn query(&self, promql: &str) -> Vec<Value> {
        let path = format!(
            "/api/v1/query?query={}",
            utf8_percent_encode(promql, NON_ALPHANUMERIC)
        );
        let (status, body) = http_get(&self.ns, self.listen, &path)
            .unwrap_or_else(|e| panic!("query {promql}: {e}"));
        let doc: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("query {promql}: HTTP {status}, not JSON ({e}): {body}"));
        assert_eq!(doc["status"], "success", "query {promql}: {doc}");
        doc["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The value of the one-series result of `promql` (`None`: no series).
    pub fn scalar(&self, promql: &str) -> Option<f64> {
        let result = self.query(promql);
        assert!(
            result.len() <= 1,
            "{promql}: more than one series: {result:?}"
        );
        result
            .first()
            .and_then(|series| series["value"][1].as_str())
            .and_then(|v| v.parse().ok())
    }

    /// Polls `promql` until `accept` takes its value, within `within`;
    /// the last value seen either way.
    pub fn wait_for(
        &self,
        promql: &str,
        within: Duration,
        accept: impl Fn(f64) -> bool,
    ) -> Result<f64, Option<f64>> {
        let deadline = Instant::now() + within;
        let mut last = None;
        while Instant::now() < deadline {
            last = self.scalar(promql);
            if let Some(value) = last
                && accept(value)
            {
                return Ok(value);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        Err(last)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
