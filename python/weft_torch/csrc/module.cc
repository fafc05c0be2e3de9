// Python entry points of the extension: the backend is created by
// weft_torch/__init__.py once the group's ranks shared a unique id.
#include <torch/extension.h>

#include "backend.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def(
      "new_unique_id", [] { return pybind11::bytes(weft_torch::new_unique_id()); },
      "A fresh weftUniqueId; this process then hosts the group's rendezvous.");
  m.def(
      "create_backend",
      [](const std::string& unique_id, int rank, int size,
         int64_t timeout_ms) -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<weft_torch::WeftBackend>(unique_id, rank, size,
                                                            std::chrono::milliseconds(timeout_ms));
      },
      pybind11::arg("unique_id"), pybind11::arg("rank"), pybind11::arg("size"),
      pybind11::arg("timeout_ms"), pybind11::call_guard<pybind11::gil_scoped_release>(),
      "Joins the Weft communicator of rank `rank` of `size` ranks.");
}
