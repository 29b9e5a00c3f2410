"""One description of a fast op with a hand-written backward, and the three forms it runs in.

A fast op is `forward` (plain PyTorch or an extension's kernel) with a hand-written `backward`
that saves little (references and per-token scalars). It runs

  - under `torch.compile`, with a gradient needed: as a `torch.library.custom_op` with a fake
    implementation and registered autograd, so models trace through it without graph breaks;
  - in eager mode with a gradient: through a `torch.autograd.Function`, because the custom-op
    dispatcher costs about 0.25 ms a call in Python (which would dominate decoding a token at a time);
  - without a gradient (eager or compiled): `forward` directly, so inductor fuses its plain ops.

`FastOp` builds all three from one description and dispatches between them; `compiled_op` builds
only the first, for ops whose eager forms are not Python (fused_cpu's C++ autograd nodes).

The description. Arguments are tensors, lists of tensors or other values (floats, bools, dtypes);
the output is a tensor or a tuple of them.
  - forward(*args): the op; its annotations are the custom op's schema (`torch.library.infer_schema`).
  - fake(*args): empty tensors of the output's shapes and dtypes, for tracing.
  - save(args, output) -> tuple: what backward needs; each item a tensor, a list of tensors (both
    saved with `save_for_backward`) or another value (kept as it is).
  - backward(saved, *grads) -> tuple: `saved` as save returned it, one gradient per output (None for
    an output without one, in eager mode, when materialize_grads is False); returns one gradient per
    argument: a tensor or None, a list of them (or None) for a list, None for a non-tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

Save = Callable[[tuple[Any, ...], Any], tuple[Any, ...]]  # save(args, output) -> saved
Backward = Callable[..., Sequence[Any]]  # backward(saved, *grads) -> one gradient per argument


def _flatten(items: Sequence[Any]) -> tuple[tuple[int, ...], list[Any]]:
    """items -> (layout, flat): each list (or tuple) spread into its elements, whose count the layout
    keeps; -1 for any other item, which stays as it is."""
    layout, flat = [], []
    for item in items:
        if isinstance(item, (list, tuple)):
            layout.append(len(item))
            flat.extend(item)
        else:
            layout.append(-1)
            flat.append(item)
    return tuple(layout), flat


def _unflatten(layout: tuple[int, ...], flat: Sequence[Any]) -> list[Any]:
    """The inverse of `_flatten`; lists come back as lists."""
    items, at = [], 0
    for count in layout:
        if count < 0:
            items.append(flat[at])
            at += 1
        else:
            items.append(list(flat[at:at + count]))
            at += count
    return items


def _save(ctx: Any, items: tuple[Any, ...]) -> None:
    """Save what `save` returned: its tensors with ctx.save_for_backward, the rest on ctx. The layout
    has None for a tensor, the length for a list (or tuple) of tensors, (value,) for any other value."""
    tensors, layout = [], []
    for item in items:
        if isinstance(item, Tensor):
            tensors.append(item)
            layout.append(None)
        elif isinstance(item, (list, tuple)):
            tensors.extend(item)
            layout.append(len(item))
        else:
            layout.append((item,))
    ctx.save_for_backward(*tensors)
    ctx.fast_op_saved = layout


def _saved(ctx: Any) -> list[Any]:
    """What `_save` saved, in save's structure (lists as lists)."""
    tensors, items, at = ctx.saved_tensors, [], 0
    for entry in ctx.fast_op_saved:
        if entry is None:
            items.append(tensors[at])
            at += 1
        elif isinstance(entry, int):
            items.append(list(tensors[at:at + entry]))
            at += entry
        else:
            items.append(entry[0])
    return items


def compiled_op(name: str, forward: Callable[..., Any], *, fake: Callable[..., Any], save: Save,
                backward: Backward) -> torch.library.CustomOpDef:
    """The custom op `name` ("namespace::op") running `forward`, with `fake` for tracing and autograd
    from `save` and `backward` (module docstring). Differentiable in eager mode too (at the
    dispatcher's cost), not twice."""
    op = torch.library.custom_op(name, forward, mutates_args=())
    op.register_fake(fake)

    def setup_context(ctx, inputs, output) -> None:
        _save(ctx, save(inputs, output))

    def op_backward(ctx, *grads):
        return tuple(backward(_saved(ctx), *grads))

    op.register_autograd(op_backward, setup_context=setup_context)
    return op


class FastOp:
    """A fast op in its three forms (module docstring); calling it picks one as the routing ops do.

    op: the custom op (the compiled form); forward: the op without autograd; `autograd(*args)`: the
    eager form (a `torch.autograd.Function` named after the op, e.g. "attnres::inv_rms" -> _InvRms).
    materialize_grads=False: the eager form passes backward None, not zeros, for an output without
    a gradient (the custom op's autograd always passes zeros).
    """

    def __init__(self, name: str, forward: Callable[..., Any], *, fake: Callable[..., Any], save: Save,
                 backward: Backward, materialize_grads: bool = True) -> None:
        self.forward = forward
        self.op = compiled_op(name, forward, fake=fake, save=save, backward=backward)

        def function_forward(ctx, layout: tuple[int, ...], *flat: Any) -> Any:
            args = tuple(_unflatten(layout, flat))
            output = forward(*args)
            ctx.fast_op_layout = layout
            _save(ctx, save(args, output))
            ctx.set_materialize_grads(materialize_grads)
            return output

        def function_backward(ctx, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
            flat = []
            for count, grad in zip(ctx.fast_op_layout, backward(_saved(ctx), *grads), strict=True):
                if count < 0:
                    flat.append(grad)
                else:
                    flat.extend([None] * count if grad is None else grad)
            return None, *flat

        class_name = "_" + "".join(part.title() for part in name.split("::")[-1].split("_"))
        self._function = type(class_name, (torch.autograd.Function,), {
            "forward": staticmethod(function_forward), "backward": staticmethod(function_backward)})

    def autograd(self, *args: Any) -> Any:
        """The eager form: forward and backward through the autograd.Function."""
        layout, flat = _flatten(args)
        return self._function.apply(layout, *flat)

    def __call__(self, *args: Any) -> Any:
        """forward without a gradient to compute (no grad mode or no input requiring one), also when
        compiling (inductor then fuses its plain ops); else the custom op when compiling, the
        autograd.Function when not."""
        if not (torch.is_grad_enabled() and _any_requires_grad(args)):
            return self.forward(*args)
        if torch.compiler.is_compiling():
            return self.op(*args)
        return self.autograd(*args)


def _any_requires_grad(args: tuple[Any, ...]) -> bool:
    """Whether a tensor among args, or in a list among them, requires grad."""
    for arg in args:
        if isinstance(arg, (list, tuple)):
            if any(t.requires_grad for t in arg):
                return True
        elif isinstance(arg, Tensor) and arg.requires_grad:
            return True
    return False
