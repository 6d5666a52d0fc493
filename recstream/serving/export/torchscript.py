"""TorchScript from a ``torch.export`` program: script its ATen graph, batch size kept dynamic.

Neither ``torch.jit.script`` nor ``torch.jit.trace`` takes the recstream models directly:
script does not compile their Python (``Schema`` annotations, dataclasses), and trace records
the batch size as a constant wherever it becomes a Python int (it then serves one batch size
only). The program of ``torch.export`` is a flat graph of ATen operators with symbolic sizes;
TorchScript compiles such a graph once three export-only details are rewritten:

* operator overloads (``aten.add.Tensor``) become their packets (``aten.add``): TorchScript
  resolves overloads by schema itself and cannot look up the overload attribute;
* ``aten.sym_size.int`` (a symbolic size) becomes ``aten.size``, read at run time;
* the call of the export's input guard (``_guards_fn``) is dropped (TorchScript checks dtypes
  and ranks as any ATen call does), and the pytree code generation is replaced by plain
  positional arguments and a single tensor result.

>>> import torch
>>> class Twice(torch.nn.Module):
...     def forward(self, x):
...         return x.view(x.shape[0], -1).sum(1) * 2
>>> ep = torch.export.export(Twice(), (torch.ones(3, 2),), dynamic_shapes=({0: torch.export.Dim("b")},))
>>> to_torchscript(ep)(torch.ones(5, 2)).tolist()
[4.0, 4.0, 4.0, 4.0, 4.0]
"""
from __future__ import annotations

import warnings

import torch
from torch import fx


def _plain_graph(program: torch.export.ExportedProgram) -> fx.GraphModule:
    module = program.module()
    gm = fx.GraphModule(module, module.graph)  # a copy: the program's own module is left alone
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            graph.erase_node(node)
    # Before the overloads become packets: fx keeps a node whose result is unused only when it
    # knows the operator mutates an input (``cumsum.out`` into a slice), which an overload's
    # schema tells and a packet does not.
    graph.eliminate_dead_code()
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.sym_size.int:
            node.target = torch.ops.aten.size
        elif node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            node.target = node.target.overloadpacket
        elif node.op == "output":
            results = node.args[0]
            if isinstance(results, (tuple, list)) and len(results) == 1:
                node.args = (results[0],)
    graph._codegen = fx.graph.CodeGen()  # positional arguments in, the result out (no pytree)
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm


def to_torchscript(program: torch.export.ExportedProgram) -> torch.jit.ScriptModule:
    """A ScriptModule computing what `program` computes, for the same input shapes."""
    graph = _plain_graph(program)
    with warnings.catch_warnings():
        # TorchScript is deprecated upstream, but it is what LibTorch and Triton's pytorch
        # backend load: the user asked for it, the warning would only be noise.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message="The TorchScript type system")
        return torch.jit.script(graph)
