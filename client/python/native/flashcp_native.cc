// _flashcp_native: the Python package's binding to the C++ core (pybind11).
// Thin adapters only: planning is proto::PlanBatch (what the
// service runs), the exchange layout is worker::BuildCpRankLayout (the CPU
// engine's and the GPU step's layout, from core::BuildCommLayout), the attention is the CPU
// kernels of worker/attention_cpu.h, or on CUDA tensors the project's cuDNN
// path (cuda_backend.h). Tensors cross as (address, element count) pairs that
// the Python side takes from contiguous torch tensors; every count is checked
// here against what the layout needs before a kernel touches memory. Errors:
// ValueError for InvalidArgument, NotImplementedError for Unimplemented (a
// build without CUDA), RuntimeError naming the status code otherwise.
#include "client/python/native/native_common.h"

PYBIND11_MODULE(_flashcp_native, m) {
  m.doc() = "FlashCP's C++ core for the flashcp Python package (planner, layout, CPU attention)";
  flashcp::python::BindPlanning(m);
  flashcp::python::BindCpu(m);
  flashcp::python::BindCuda(m);
}
