#include "tests/testing/grpc_probes.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/unknown_field_set.h"
#include "proto/rpc/grpc_status.h"

namespace flashcp::tests::testing {
namespace {

constexpr char kHealthCheck[] = "/grpc.health.v1.Health/Check";
constexpr char kHealthWatch[] = "/grpc.health.v1.Health/Watch";
constexpr char kReflection[] = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";

// Protobuf wire format: a length-delimited field (strings, messages).
std::string LengthDelimited(int field, const std::string& value) {
  std::string out;
  out.push_back(static_cast<char>((field << 3) | 2));
  uint64_t n = value.size();
  while (n >= 0x80) {
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
    n >>= 7;
  }
  out.push_back(static_cast<char>(n));
  return out + value;
}

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

absl::StatusOr<std::string> FromBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return absl::DataLossError("unreadable gRPC message");
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// UnknownFieldSet is neither copyable nor movable, hence the pointer.
absl::StatusOr<std::unique_ptr<google::protobuf::UnknownFieldSet>> Parse(const std::string& bytes) {
  auto fields = std::make_unique<google::protobuf::UnknownFieldSet>();
  if (!fields->ParseFromString(bytes)) return absl::DataLossError("not a protobuf message");
  return fields;
}

// HealthCheckResponse { ServingStatus status = 1; }
absl::StatusOr<HealthStatus> ParseHealth(const grpc::ByteBuffer& buffer) {
  absl::StatusOr<std::string> bytes = FromBuffer(buffer);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<std::unique_ptr<google::protobuf::UnknownFieldSet>> fields = Parse(*bytes);
  if (!fields.ok()) return fields.status();
  HealthStatus status = HealthStatus::kUnknown;  // absent field: 0
  for (int i = 0; i < (*fields)->field_count(); ++i) {
    const google::protobuf::UnknownField& f = (*fields)->field(i);
    if (f.number() == 1 && f.type() == google::protobuf::UnknownField::TYPE_VARINT) {
      status = static_cast<HealthStatus>(f.varint());
    }
  }
  return status;
}

}  // namespace

grpc::Status RawUnaryCall(grpc::GenericStub& stub, const std::string& method,
                          const grpc::ByteBuffer& request, absl::Time deadline,
                          grpc::ByteBuffer* response) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&context, method, request, &cq);
  call->StartCall();
  grpc::ByteBuffer answer;
  grpc::Status status;
  int tag = 0;
  call->Finish(&answer, &status, &tag);
  void* got = nullptr;
  bool ok = false;
  if (!cq.Next(&got, &ok)) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "completion queue shut down");
  }
  cq.Shutdown();
  while (cq.Next(&got, &ok)) {
  }
  if (response != nullptr) *response = std::move(answer);
  return status;
}

const char* HealthStatusName(HealthStatus s) {
  switch (s) {
    case HealthStatus::kUnknown:
      return "UNKNOWN";
    case HealthStatus::kServing:
      return "SERVING";
    case HealthStatus::kNotServing:
      return "NOT_SERVING";
    case HealthStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return "?";
}

absl::StatusOr<HealthStatus> CheckHealth(std::shared_ptr<grpc::Channel> channel, const std::string& service,
                                         absl::Time deadline) {
  grpc::GenericStub stub(std::move(channel));
  // HealthCheckRequest { string service = 1; }
  const grpc::ByteBuffer request = ToBuffer(service.empty() ? "" : LengthDelimited(1, service));
  grpc::ByteBuffer response;
  const grpc::Status status = RawUnaryCall(stub, kHealthCheck, request, deadline, &response);
  if (!status.ok()) return proto::rpc::FromGrpcStatus(status);
  return ParseHealth(response);
}

absl::Status WaitForServing(std::shared_ptr<grpc::Channel> channel, const std::string& service,
                            absl::Time deadline) {
  std::string last = "no answer";
  while (absl::Now() < deadline) {
    // Each try is bounded; UNAVAILABLE while the server comes up is expected.
    absl::StatusOr<HealthStatus> s =
        CheckHealth(channel, service, std::min(deadline, absl::Now() + absl::Seconds(1)));
    if (s.ok() && *s == HealthStatus::kServing) return absl::OkStatus();
    last = s.ok() ? HealthStatusName(*s) : s.status().ToString();
  }
  return absl::DeadlineExceededError(absl::StrCat("not SERVING by the deadline; last: ", last));
}

absl::StatusOr<std::unique_ptr<HealthWatch>> HealthWatch::Start(
    std::shared_ptr<grpc::Channel> channel, const std::string& service, absl::Time deadline) {
  std::unique_ptr<HealthWatch> w(new HealthWatch());
  w->channel_ = std::move(channel);
  grpc::GenericStub stub(w->channel_);
  w->call_ = stub.PrepareCall(&w->context_, kHealthWatch, &w->cq_);
  bool ok = false;
  int start_tag = 0;
  w->call_->StartCall(&start_tag);
  ++w->pending_;
  if (absl::Status s = w->Await(&start_tag, deadline, &ok); !s.ok()) return s;
  if (!ok) return absl::UnavailableError("Health/Watch: could not start the call");
  int write_tag = 0;
  w->call_->WriteLast(ToBuffer(service.empty() ? "" : LengthDelimited(1, service)),
                      grpc::WriteOptions(), &write_tag);
  ++w->pending_;
  if (absl::Status s = w->Await(&write_tag, deadline, &ok); !s.ok()) return s;
  if (!ok) return absl::UnavailableError("Health/Watch: could not send the request");
  return w;
}

absl::Status HealthWatch::Await(void* tag, absl::Time deadline, bool* ok) {
  void* got = nullptr;
  switch (cq_.AsyncNext(&got, ok, absl::ToChronoTime(deadline))) {
    case grpc::CompletionQueue::GOT_EVENT:
      --pending_;
      if (got != tag) return absl::InternalError("Health/Watch: unexpected completion");
      return absl::OkStatus();
    case grpc::CompletionQueue::TIMEOUT:
      return absl::DeadlineExceededError("Health/Watch: nothing before the deadline");
    case grpc::CompletionQueue::SHUTDOWN:
      break;
  }
  return absl::InternalError("Health/Watch: completion queue shut down");
}

absl::StatusOr<HealthStatus> HealthWatch::Next(absl::Time deadline) {
  bool ok = false;
  int read_tag = 0;
  call_->Read(&read_buf_, &read_tag);
  ++pending_;
  if (absl::Status s = Await(&read_tag, deadline, &ok); !s.ok()) {
    context_.TryCancel();  // the read stays pending; the destructor drains it
    return s;
  }
  if (!ok) {
    grpc::Status status;
    int finish_tag = 0;
    call_->Finish(&status, &finish_tag);
    ++pending_;
    if (absl::Status s = Await(&finish_tag, deadline, &ok); !s.ok()) return s;
    if (status.ok()) return absl::OutOfRangeError("Health/Watch: the server ended the stream");
    return proto::rpc::FromGrpcStatus(status);
  }
  return ParseHealth(read_buf_);
}

HealthWatch::~HealthWatch() {
  context_.TryCancel();
  void* got = nullptr;
  bool ok = false;
  // Every started operation completes (ok=false) once the call is cancelled.
  while (pending_ > 0 && cq_.Next(&got, &ok)) --pending_;
  cq_.Shutdown();
  while (cq_.Next(&got, &ok)) {
  }
}

absl::StatusOr<std::vector<std::string>> ListServicesByReflection(
    std::shared_ptr<grpc::Channel> channel, absl::Time deadline) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context, kReflection, &cq);
  // One operation at a time; each completes (ok may be false) before the next.
  auto step = [&cq](auto start) {
    bool ok = false;
    void* got = nullptr;
    int tag = 0;
    start(&tag);
    return cq.Next(&got, &ok) && ok;
  };
  grpc::ByteBuffer response;
  grpc::Status status;
  // ServerReflectionRequest { string list_services = 7; }
  const bool sent = step([&](int* t) { call->StartCall(t); }) &&
                    step([&](int* t) {
                      call->WriteLast(ToBuffer(LengthDelimited(7, "*")), grpc::WriteOptions(), t);
                    });
  const bool got_reply = sent && step([&](int* t) { call->Read(&response, t); });
  if (got_reply) {  // the server ends the stream after our half-close
    grpc::ByteBuffer extra;
    while (step([&](int* t) { call->Read(&extra, t); })) {
    }
  }
  step([&](int* t) { call->Finish(&status, t); });
  cq.Shutdown();
  {
    void* got = nullptr;
    bool ok = false;
    while (cq.Next(&got, &ok)) {
    }
  }
  if (!status.ok()) return proto::rpc::FromGrpcStatus(status);
  if (!got_reply) return absl::DataLossError("reflection: no reply");

  // ServerReflectionResponse { ListServiceResponse list_services_response = 6;
  //                            ErrorResponse error_response = 7; }
  // ListServiceResponse { repeated ServiceResponse service = 1; }
  // ServiceResponse { string name = 1; }
  absl::StatusOr<std::string> bytes = FromBuffer(response);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<std::unique_ptr<google::protobuf::UnknownFieldSet>> parsed = Parse(*bytes);
  if (!parsed.ok()) return parsed.status();
  const google::protobuf::UnknownFieldSet* top = parsed->get();
  std::vector<std::string> names;
  for (int i = 0; i < top->field_count(); ++i) {
    const google::protobuf::UnknownField& f = top->field(i);
    if (f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    if (f.number() == 7) return absl::UnknownError("reflection: the server answered an error");
    if (f.number() != 6) continue;
    absl::StatusOr<std::unique_ptr<google::protobuf::UnknownFieldSet>> list_or =
        Parse(f.length_delimited());
    if (!list_or.ok()) return list_or.status();
    const google::protobuf::UnknownFieldSet* list = list_or->get();
    for (int j = 0; j < list->field_count(); ++j) {
      if (list->field(j).number() != 1) continue;
      absl::StatusOr<std::unique_ptr<google::protobuf::UnknownFieldSet>> svc_or =
          Parse(list->field(j).length_delimited());
      if (!svc_or.ok()) return svc_or.status();
      const google::protobuf::UnknownFieldSet* svc = svc_or->get();
      for (int k = 0; k < svc->field_count(); ++k) {
        if (svc->field(k).number() == 1) names.push_back(svc->field(k).length_delimited());
      }
    }
  }
  return names;
}

}  // namespace flashcp::tests::testing
