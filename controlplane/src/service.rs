//! The gRPC service: calls the state with each decoded request, records
//! metrics, and maps errors through [`crate::status::counted_status`]
//! (requests tonic could not decode never get here: see
//! [`crate::malformed`]).

use std::sync::Arc;

use tokio::time::Instant;

use agentmesh_proto::pb::controlplane::{
    ApplyPolicyRequest, ApplyPolicyResponse, CreateTokenRequest, CreateTokenResponse,
    EnrollRequest, EnrollResponse, GetDirectoryRequest, GetDirectoryResponse, GetKeysRequest,
    GetKeysResponse, GetPolicyRequest, GetPolicyResponse, ListNodesRequest, ListNodesResponse,
    ListTokensRequest, ListTokensResponse, RefreshRequest, RefreshResponse, RevokeNodeRequest,
    RevokeNodeResponse, RevokeTokenRequest, RevokeTokenResponse, RotateKeyNowRequest,
    RotateKeyNowResponse, RouterLeaseRequest, RouterLeaseResponse, WatchRequest,
    control_plane_server::ControlPlane,
};
use tonic::{Request, Response, Status};

use crate::{
    state::State,
    status::{ServiceError, counted_status},
};

/// The `ControlPlane` gRPC service.
#[derive(Debug, Clone)]
pub struct Service {
    state: Arc<State>,
}

impl Service {
    /// A service over shared state.
    pub fn new(state: Arc<State>) -> Self {
        Self { state }
    }

    fn finish<T>(
        &self,
        method: &'static str,
        started: Instant,
        r: Result<T, ServiceError>,
    ) -> Result<Response<T>, Status> {
        crate::malformed::mark_handled();
        let m = &self.state.metrics;
        let r = r
            .map(Response::new)
            .map_err(|e| counted_status(m, method, &e));
        let code = r
            .as_ref()
            .map(|_| tonic::Code::Ok)
            .unwrap_or_else(|s| s.code());
        m.rpc_done(method, code, started.elapsed().as_secs_f64());
        r
    }

    fn admin<T>(&self, req: &Request<T>) -> Result<(), ServiceError> {
        let auth = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let source = req.remote_addr().map(|a| a.ip());
        self.state.check_admin(source, auth)
    }

    /// [`Service::admin`], then the request id the caller sent, if any.
    fn admin_with_request_id<T>(&self, req: &Request<T>) -> Result<Option<String>, ServiceError> {
        self.admin(req)?;
        crate::request_ids::from_metadata(req.metadata())
    }
}

#[tonic::async_trait]
impl ControlPlane for Service {
    async fn enroll(
        &self,
        request: Request<EnrollRequest>,
    ) -> Result<Response<EnrollResponse>, Status> {
        let t = Instant::now();
        let source = request.remote_addr().map(|a| a.ip());
        let r = self.state.enroll(source, request.into_inner()).await;
        self.finish("Enroll", t, r)
    }

    async fn refresh(
        &self,
        request: Request<RefreshRequest>,
    ) -> Result<Response<RefreshResponse>, Status> {
        let t = Instant::now();
        let source = request.remote_addr().map(|a| a.ip());
        let r = self.state.refresh(source, request.into_inner()).await;
        self.finish("Refresh", t, r)
    }

    async fn get_keys(
        &self,
        request: Request<GetKeysRequest>,
    ) -> Result<Response<GetKeysResponse>, Status> {
        let t = Instant::now();
        let source = request.remote_addr().map(|a| a.ip());
        let r = self
            .state
            .limits
            .check_unauth(source)
            .map(|()| GetKeysResponse {
                keys: Some(self.state.get_keys()),
            });
        self.finish("GetKeys", t, r)
    }

    async fn get_directory(
        &self,
        request: Request<GetDirectoryRequest>,
    ) -> Result<Response<GetDirectoryResponse>, Status> {
        let t = Instant::now();
        let source = request.remote_addr().map(|a| a.ip());
        let r = match self.state.limits.check_unauth(source) {
            Ok(()) => self.state.get_directory_for(request.get_ref()).await,
            Err(e) => Err(e),
        };
        self.finish("GetDirectory", t, r)
    }

    async fn router_lease(
        &self,
        request: Request<RouterLeaseRequest>,
    ) -> Result<Response<RouterLeaseResponse>, Status> {
        let t = Instant::now();
        let source = request.remote_addr().map(|a| a.ip());
        let r = self.state.router_lease(source, request.into_inner()).await;
        self.finish("RouterLease", t, r)
    }

    async fn create_token(
        &self,
        request: Request<CreateTokenRequest>,
    ) -> Result<Response<CreateTokenResponse>, Status> {
        let t = Instant::now();
        let r = match self.admin_with_request_id(&request) {
            Ok(id) => self.state.create_token(request.into_inner(), id).await,
            Err(e) => Err(e),
        };
        self.finish("CreateToken", t, r)
    }

    async fn revoke_node(
        &self,
        request: Request<RevokeNodeRequest>,
    ) -> Result<Response<RevokeNodeResponse>, Status> {
        let t = Instant::now();
        let r = match self.admin_with_request_id(&request) {
            Ok(id) => self.state.revoke_node(request.into_inner(), id).await,
            Err(e) => Err(e),
        };
        self.finish("RevokeNode", t, r)
    }

    async fn rotate_key_now(
        &self,
        request: Request<RotateKeyNowRequest>,
    ) -> Result<Response<RotateKeyNowResponse>, Status> {
        let t = Instant::now();
        let r = match self.admin_with_request_id(&request) {
            Ok(id) => self.state.rotate_key_now(request.into_inner(), id).await,
            Err(e) => Err(e),
        };
        self.finish("RotateKeyNow", t, r)
    }

    async fn apply_policy(
        &self,
        request: Request<ApplyPolicyRequest>,
    ) -> Result<Response<ApplyPolicyResponse>, Status> {
        let t = Instant::now();
        let source = request.remote_addr().map(|a| a.ip());
        let r = match self.admin_with_request_id(&request) {
            Ok(id) => {
                self.state
                    .apply_policy_rpc(source, request.into_inner(), id)
                    .await
            }
            Err(e) => Err(e),
        };
        self.finish("ApplyPolicy", t, r)
    }

    async fn get_policy(
        &self,
        request: Request<GetPolicyRequest>,
    ) -> Result<Response<GetPolicyResponse>, Status> {
        let t = Instant::now();
        let r = match self.admin(&request) {
            Ok(()) => self.state.get_policy_rpc(request.into_inner()).await,
            Err(e) => Err(e),
        };
        self.finish("GetPolicy", t, r)
    }

    async fn revoke_token(
        &self,
        request: Request<RevokeTokenRequest>,
    ) -> Result<Response<RevokeTokenResponse>, Status> {
        let t = Instant::now();
        let r = match self.admin_with_request_id(&request) {
            Ok(id) => self.state.revoke_token(request.into_inner(), id).await,
            Err(e) => Err(e),
        };
        self.finish("RevokeToken", t, r)
    }

    async fn list_tokens(
        &self,
        request: Request<ListTokensRequest>,
    ) -> Result<Response<ListTokensResponse>, Status> {
        let t = Instant::now();
        let r = match self.admin(&request) {
            Ok(()) => self.state.list_tokens(request.into_inner()).await,
            Err(e) => Err(e),
        };
        self.finish("ListTokens", t, r)
    }

    async fn list_nodes(
        &self,
        request: Request<ListNodesRequest>,
    ) -> Result<Response<ListNodesResponse>, Status> {
        let t = Instant::now();
        let r = match self.admin(&request) {
            Ok(()) => self.state.list_nodes(request.into_inner()).await,
            Err(e) => Err(e),
        };
        self.finish("ListNodes", t, r)
    }

    type WatchStream = crate::watch::WatchStream;

    /// Counted in `rpc{method="Watch"}` when the stream opens (or is
    /// refused), not when it ends.
    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let t = Instant::now();
        let source = request.remote_addr().map(|a| a.ip());
        let r = self.state.watch_stream(source, request.into_inner()).await;
        self.finish("Watch", t, r)
    }
}
