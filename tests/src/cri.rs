//! A small client of the Kubernetes Container Runtime Interface (`runtime.v1`,
//! gRPC over a unix socket), for driving containerd the way the kubelet does.
//!
//! The messages are written by hand with `prost` derives, field numbers taken
//! from kubernetes/cri-api `pkg/apis/runtime/v1/api.proto`, and only the
//! fields the tests set or read: protobuf skips unknown fields, so a partial
//! message is wire-compatible with the full one (and no `protoc` is needed
//! at build time). The client is blocking: each call runs on a private
//! multi-threaded tokio runtime, so any number of test threads may call at
//! once over the one HTTP/2 connection (concurrent `StopPodSandbox` calls
//! are a scenario of their own).

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::codegen::Service;
use tonic::codegen::http::Uri;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

/// The gRPC service of the runtime calls.
const RUNTIME_SERVICE: &str = "runtime.v1.RuntimeService";

/// How long one CRI call may take (RunPodSandbox runs the whole CNI ADD).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A CRI call that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("could not start the tokio runtime for the CRI client")]
    Runtime(#[source] std::io::Error),
    #[error("could not connect to the CRI socket {socket}")]
    Connect {
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    /// The runtime answered with a gRPC error: `message` is its own text
    /// (for a failed CNI ADD, the plugin's error).
    #[error("CRI {method} failed ({code:?}): {message}")]
    Call {
        method: &'static str,
        code: tonic::Code,
        message: String,
    },
}

// ---- messages ---------------------------------------------------------------

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionRequest {
    #[prost(string, tag = "1")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionResponse {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    #[prost(string, tag = "4")]
    pub runtime_api_version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRequest {
    #[prost(bool, tag = "1")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<RuntimeStatus>,
    /// With `verbose`: JSON documents by name; containerd's `cniconfig` is
    /// the CNI configuration it has loaded.
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RuntimeStatus {
    #[prost(message, repeated, tag = "1")]
    pub conditions: Vec<RuntimeCondition>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RuntimeCondition {
    /// `RuntimeReady` or `NetworkReady`.
    #[prost(string, tag = "1")]
    pub r#type: String,
    #[prost(bool, tag = "2")]
    pub status: bool,
    #[prost(string, tag = "3")]
    pub reason: String,
    #[prost(string, tag = "4")]
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Protocol {
    Tcp = 0,
    Udp = 1,
    Sctp = 2,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PortMapping {
    #[prost(enumeration = "Protocol", tag = "1")]
    pub protocol: i32,
    #[prost(int32, tag = "2")]
    pub container_port: i32,
    #[prost(int32, tag = "3")]
    pub host_port: i32,
    #[prost(string, tag = "4")]
    pub host_ip: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub uid: String,
    #[prost(string, tag = "3")]
    pub namespace: String,
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxConfig {
    #[prost(string, tag = "1")]
    pub cgroup_parent: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(string, tag = "2")]
    pub hostname: String,
    #[prost(string, tag = "3")]
    pub log_directory: String,
    #[prost(message, repeated, tag = "5")]
    pub port_mappings: Vec<PortMapping>,
    #[prost(map = "string, string", tag = "6")]
    pub labels: HashMap<String, String>,
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxRequest {
    #[prost(message, optional, tag = "1")]
    pub config: Option<PodSandboxConfig>,
    #[prost(string, tag = "2")]
    pub runtime_handler: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxResponse {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

/// The request of StopPodSandbox, RemovePodSandbox (same shape).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxIdRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

/// The response of StopPodSandbox, RemovePodSandbox, StartContainer.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<PodSandboxStatus>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PodSandboxState {
    SandboxReady = 0,
    SandboxNotready = 1,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatus {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(enumeration = "PodSandboxState", tag = "3")]
    pub state: i32,
    #[prost(message, optional, tag = "5")]
    pub network: Option<PodSandboxNetworkStatus>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxNetworkStatus {
    #[prost(string, tag = "1")]
    pub ip: String,
    #[prost(message, repeated, tag = "2")]
    pub additional_ips: Vec<PodIp>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodIp {
    #[prost(string, tag = "1")]
    pub ip: String,
}

/// ListPodSandbox without a filter: every sandbox.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    #[prost(enumeration = "PodSandboxState", tag = "3")]
    pub state: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerMetadata {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageSpec {
    #[prost(string, tag = "1")]
    pub image: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerConfig {
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ContainerMetadata>,
    #[prost(message, optional, tag = "2")]
    pub image: Option<ImageSpec>,
    #[prost(string, repeated, tag = "3")]
    pub command: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    pub args: Vec<String>,
    /// Relative to the sandbox's `log_directory`.
    #[prost(string, tag = "11")]
    pub log_path: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    pub config: Option<ContainerConfig>,
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerResponse {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StartContainerRequest {
    #[prost(string, tag = "1")]
    pub container_id: String,
}

// ---- client -----------------------------------------------------------------

/// Connects every new HTTP/2 connection of the channel to one unix socket
/// (the URI of the endpoint is only a placeholder).
#[derive(Debug, Clone)]
struct UnixConnector {
    socket: PathBuf,
}

impl Service<Uri> for UnixConnector {
    type Response = TokioIo<tokio::net::UnixStream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let socket = self.socket.clone();
        Box::pin(async move {
            let stream = tokio::net::UnixStream::connect(socket).await?;
            Ok(TokioIo::new(stream))
        })
    }
}

/// A blocking CRI client on one socket (see the module docs).
#[derive(Debug)]
pub struct CriClient {
    channel: Channel,
    // Declared last: the channel's tasks run on it and are dropped first.
    runtime: tokio::runtime::Runtime,
}

impl CriClient {
    /// Connects to the CRI socket `socket` (which must exist).
    pub fn connect(socket: &Path) -> Result<CriClient, CriError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cri-client")
            .enable_all()
            .build()
            .map_err(CriError::Runtime)?;
        let connector = UnixConnector {
            socket: socket.to_path_buf(),
        };
        let endpoint = Endpoint::from_static("http://cri.invalid")
            .connect_timeout(Duration::from_secs(5))
            .timeout(CALL_TIMEOUT);
        let channel = runtime
            .block_on(endpoint.connect_with_connector(connector))
            .map_err(|source| CriError::Connect {
                socket: socket.to_path_buf(),
                source,
            })?;
        Ok(CriClient { channel, runtime })
    }

    /// One unary call of `RuntimeService/<method>`.
    fn call<Req, Resp>(&self, method: &'static str, request: Req) -> Result<Resp, CriError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let path = PathAndQuery::try_from(format!("/{RUNTIME_SERVICE}/{method}"))
            .expect("a CRI method name is a valid URI path");
        let failed = |status: tonic::Status| CriError::Call {
            method,
            code: status.code(),
            message: status.message().to_owned(),
        };
        self.runtime.block_on(async {
            let mut grpc = tonic::client::Grpc::new(self.channel.clone());
            grpc.ready()
                .await
                .map_err(|e| failed(tonic::Status::unavailable(e.to_string())))?;
            let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
            grpc.unary(tonic::Request::new(request), path, codec)
                .await
                .map(tonic::Response::into_inner)
                .map_err(failed)
        })
    }

    pub fn version(&self) -> Result<VersionResponse, CriError> {
        self.call("Version", VersionRequest::default())
    }

    pub fn status(&self, verbose: bool) -> Result<StatusResponse, CriError> {
        self.call("Status", StatusRequest { verbose })
    }

    /// RunPodSandbox: the sandbox's ID (its network is set up: CNI ADD ran).
    pub fn run_pod_sandbox(&self, config: PodSandboxConfig) -> Result<String, CriError> {
        let response: RunPodSandboxResponse = self.call(
            "RunPodSandbox",
            RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            },
        )?;
        Ok(response.pod_sandbox_id)
    }

    /// StopPodSandbox: its containers are killed and its network torn down
    /// (CNI DEL with the netns and the cached result).
    pub fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let _: Empty = self.call(
            "StopPodSandbox",
            PodSandboxIdRequest {
                pod_sandbox_id: id.to_owned(),
            },
        )?;
        Ok(())
    }

    /// RemovePodSandbox (containerd stops it first if needed and runs one
    /// more CNI DEL, without a netns).
    pub fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let _: Empty = self.call(
            "RemovePodSandbox",
            PodSandboxIdRequest {
                pod_sandbox_id: id.to_owned(),
            },
        )?;
        Ok(())
    }

    pub fn pod_sandbox_status(&self, id: &str) -> Result<PodSandboxStatus, CriError> {
        let response: PodSandboxStatusResponse = self.call(
            "PodSandboxStatus",
            PodSandboxStatusRequest {
                pod_sandbox_id: id.to_owned(),
                verbose: false,
            },
        )?;
        Ok(response.status.unwrap_or_default())
    }

    pub fn list_pod_sandboxes(&self) -> Result<Vec<PodSandbox>, CriError> {
        let response: ListPodSandboxResponse =
            self.call("ListPodSandbox", ListPodSandboxRequest {})?;
        Ok(response.items)
    }

    /// CreateContainer in the sandbox `pod_sandbox_id`: the container's ID.
    pub fn create_container(
        &self,
        pod_sandbox_id: &str,
        config: ContainerConfig,
        sandbox_config: PodSandboxConfig,
    ) -> Result<String, CriError> {
        let response: CreateContainerResponse = self.call(
            "CreateContainer",
            CreateContainerRequest {
                pod_sandbox_id: pod_sandbox_id.to_owned(),
                config: Some(config),
                sandbox_config: Some(sandbox_config),
            },
        )?;
        Ok(response.container_id)
    }

    pub fn start_container(&self, container_id: &str) -> Result<(), CriError> {
        let _: Empty = self.call(
            "StartContainer",
            StartContainerRequest {
                container_id: container_id.to_owned(),
            },
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn port_mappings_encode_with_the_cri_field_numbers() {
        let mapping = PortMapping {
            protocol: Protocol::Udp as i32,
            container_port: 53,
            host_port: 8053,
            host_ip: "198.18.0.11".into(),
        };
        let bytes = mapping.encode_to_vec();
        // protocol = 1 (varint 1), container_port = 2 (varint 53),
        // host_port = 3 (varint 8053 = 0xf5 0x3e), host_ip = 4 (length-delimited).
        let mut expected = vec![0x08, 0x01, 0x10, 53, 0x18, 0xf5, 0x3e, 0x22, 11];
        expected.extend_from_slice(b"198.18.0.11");
        assert_eq!(bytes, expected);
        assert_eq!(PortMapping::decode(bytes.as_slice()).unwrap(), mapping);
    }

    #[test]
    fn a_partial_message_skips_the_fields_it_does_not_know() {
        // A PodSandboxStatus with created_at (4) and labels (7) as containerd
        // sends them: both unknown here, the rest still decodes.
        let mut bytes = vec![0x0a, 3, b'a', b'b', b'c', 0x18, 0x01, 0x20, 0x7b];
        bytes.extend_from_slice(&[0x3a, 6, 0x0a, 1, b'k', 0x12, 1, b'v']);
        bytes.extend_from_slice(&[0x2a, 6, 0x0a, 4, b'1', b'.', b'2', b'3']);
        let status = PodSandboxStatus::decode(bytes.as_slice()).unwrap();
        assert_eq!(status.id, "abc");
        assert_eq!(status.state, PodSandboxState::SandboxNotready as i32);
        assert_eq!(status.network.unwrap().ip, "1.23");
    }
}
