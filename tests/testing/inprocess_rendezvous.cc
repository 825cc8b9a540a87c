#include "tests/testing/inprocess_rendezvous.h"

#include "grpcpp/grpcpp.h"

namespace flashcp::tests::testing {

absl::StatusOr<std::unique_ptr<InProcessRendezvous>> InProcessRendezvous::Start(
    planner_service::RendezvousOptions options) {
  std::unique_ptr<InProcessRendezvous> r(new InProcessRendezvous());
  r->host_ = std::make_unique<planner_service::RendezvousHost>(options);
  grpc::ServerBuilder builder;
  builder.RegisterService(r->host_->service());
  r->server_ = builder.BuildAndStart();
  if (r->server_ == nullptr) {
    return absl::InternalError("in-process Rendezvous server: BuildAndStart failed");
  }
  r->stub_ = v1::Rendezvous::NewStub(r->server_->InProcessChannel(grpc::ChannelArguments()));
  return r;
}

InProcessRendezvous::~InProcessRendezvous() {
  host_->Shutdown();
  if (server_ != nullptr) server_->Shutdown();
}

}  // namespace flashcp::tests::testing
