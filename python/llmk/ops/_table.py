"""The op table: each ``torch.ops.llmk`` op is one :func:`define` call, in the family module
of the op (norm.py, activation.py, ...). An entry holds

- the schema (the op's one name and argument order, with its defaults),
- the fake: output shapes and dtypes for ``torch.compile`` and meta tensors (the C++ kernel,
  registered from python/src/ops_<family>.cc, allocates the same outputs; opcheck's fake
  tensor test holds the two to each other),
- the autograd formula where the op trains: ``setup(ctx, inputs, output)`` saves what the
  backward needs, ``backward(ctx, *grads)`` returns one gradient per input, and
- the docstring of the public function.

The public ``llmk.<op>`` functions and ``llmk.__all__`` come from the table: an entry is
public as its fast call (a function generated from the schema, :func:`_fast_call`), or
through a hand-written function registered with :func:`public` where the Python API adds
something (an optional output, a dict converted to a list, argument checks).

Per call, the fast call runs a few lines of Python: with no gradient to track it calls the
op below autograd, straight into its C++ kernel; with one, it applies the op's
autograd.Function directly. A direct ``torch.ops.llmk.<op>`` call reaches
the same Function through the op's Autograd kernel (a round trip through Python, which the
public function skips). Under ``torch.compile`` the public function calls the
op itself, so that AOTAutograd traces the registered autograd formula.
"""

from typing import Callable, Dict, Optional

import torch

LIB = torch.library.Library("llmk", "DEF")  # noqa: TOR901 (the table owns the namespace)
OPS: Dict[str, torch._ops.OpOverload] = {}
PUBLIC: Dict[str, Callable] = {}


def define(schema: str, fake: Callable, *, setup: Optional[Callable] = None, backward: Optional[Callable] = None,
           public: bool = True, doc: str = "") -> Callable:
    """Defines ``torch.ops.llmk.<name>`` from its schema. Returns the op's fast call (positional
    arguments, every one given), for the family's own wrappers and formulas."""
    name = schema.split("(", 1)[0]
    LIB.define(schema)
    op = getattr(torch.ops.llmk, name).default
    defaults = tuple(a.default_value if a.has_default_value() else None for a in op._schema.arguments)

    def full_fake(*args):  # the dispatcher drops trailing arguments equal to their defaults
        return fake(*args, *defaults[len(args):])

    torch.library.register_fake(f"llmk::{name}", full_fake, lib=LIB)
    function = None
    if backward is not None:
        function = _autograd_function(op, setup, backward)
        LIB.impl(name, _autograd_kernel(op, defaults, function), "Autograd", with_keyset=True)
    OPS[name] = op
    call = _fast_call(op, function)
    if public:
        PUBLIC[name] = _public(call, doc)
    return call


def public(fn: Callable) -> Callable:
    """Registers a hand-written public function (``llmk.<fn.__name__>``)."""
    PUBLIC[fn.__name__] = fn
    return fn


def wants_grad(*args) -> bool:
    """Whether a call on these arguments records a gradient (grad mode on and a tensor among
    them that requires one): two C calls, or while torch.compile traces, the same test in
    Python (Dynamo does not trace ``_any_requires_grad``)."""
    if _is_compiling():
        return torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    return _grad_enabled() and _any_requires_grad(*args)


def like(x: torch.Tensor, *unused) -> torch.Tensor:
    """The fake of an output with x's shape and dtype (contiguous, as the C++ kernels allocate)."""
    return x.new_empty(x.shape)


def rows_f32(x: torch.Tensor, *unused) -> torch.Tensor:
    """The fake of a float32 per-row statistic of x (rstd, loss, lse): x's shape without its last dim."""
    return x.new_empty(x.shape[:-1], dtype=torch.float32)


_below_autograd = torch._C._AutoDispatchBelowAutograd
_grad_enabled = torch._C.is_grad_enabled
_any_requires_grad = torch._C._any_requires_grad
_is_compiling = torch.compiler.is_compiling


def _fast_call(op: torch._ops.OpOverload, function: Optional[type]) -> Callable:
    """The op as a Python function of its schema's arguments and defaults (the public
    function, and what the family modules call), with the least Python per call: an op
    without autograd goes straight into the dispatcher (its Autograd key is PyTorch's C++
    fallback); an op with autograd goes below the Autograd key when no gradient is needed
    (through ``op._op``, the OpOverload's C++ entry point), else through its Function; while
    torch.compile traces, it calls the op itself so that AOTAutograd sees the registered
    formula. Generated from the schema so that every argument is passed on positionally."""
    arguments = op._schema.arguments
    params = ", ".join(a.name + (f"={a.default_value!r}" if a.has_default_value() else "") for a in arguments)
    names = ", ".join(a.name for a in arguments)
    if function is None:
        body = f"    return _op({names})\n"
    else:
        body = (f"    if _is_compiling():\n        return _op({names})\n"
                f"    if _grad_enabled() and _any_requires_grad({names}):\n        return _function.apply({names})\n"
                f"    with _below_autograd():\n        return _enter({names})\n")
    namespace = dict(_op=op, _enter=op._op, _function=function, _is_compiling=_is_compiling,
                     _grad_enabled=_grad_enabled, _any_requires_grad=_any_requires_grad,
                     _below_autograd=_below_autograd)
    exec(f"def {op._opname}({params}):\n{body}", namespace)  # noqa: S102 (a signature from the schema)
    call = namespace[op._opname]
    call.op = op
    call.__module__ = "llmk"
    return call


def _public(call: Callable, doc: str) -> Callable:
    schema = f"``{call.op._schema}``"
    call.__doc__ = f"{doc}\n\nSchema: {schema}" if doc else schema
    return call


def _autograd_function(op: torch._ops.OpOverload, setup: Callable, backward: Callable) -> type:
    """The op as an autograd.Function: forward is the op's C++ kernel (below autograd), then the
    table's ``setup(ctx, inputs, output)``; backward is the table's formula."""

    class Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            with _below_autograd():
                output = op(*args)
            setup(ctx, args, output)
            return output

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    Function.__name__ = Function.__qualname__ = f"{op._opname}_autograd"
    return Function


def _autograd_kernel(op: torch._ops.OpOverload, defaults: tuple, function: type) -> Callable:
    """The op's Autograd kernel, for calls of ``torch.ops.llmk.<op>`` (and torch.compile's
    tracing): the Function when a gradient is needed, else on below autograd."""
    redispatch = op._handle.redispatch_boxed
    after_autograd = torch._C._after_autograd_keyset

    def kernel(keyset, *args):
        if _grad_enabled() and _any_requires_grad(*args):
            return function.apply(*args, *defaults[len(args):])
        return redispatch(keyset & after_autograd, *args)

    return kernel
