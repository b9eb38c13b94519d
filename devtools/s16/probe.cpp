#include <torch/extension.h>
#include <torch/csrc/autograd/custom_function.h>
using torch::autograd::AutogradContext; using torch::autograd::variable_list;
struct Ident : public torch::autograd::Function<Ident> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x) { return x.view(x.sizes()); }
  static variable_list backward(AutogradContext* ctx, variable_list g) { return {g[0]}; }
};
torch::Tensor ident(torch::Tensor x) { return Ident::apply(x); }
PYBIND11_MODULE(ekprobe, m) { m.def("ident", &ident); }
