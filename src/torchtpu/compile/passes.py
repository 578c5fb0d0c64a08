"""Rewrites of the ATen graph before it is lowered.

`unrepeat_kv`: grouped-query attention models (Llama, Qwen, Mistral, Gemma...) repeat each key/value
head for its query heads before attention (transformers' `repeat_kv`: unsqueeze, expand, clone,
reshape). In the graph that clone is a real copy of k and v per layer — and with a static KV cache,
of the whole cache per decoding step. The attention lowerings pair each key/value head with its
query heads themselves (ops/nn.py: `_grouped`), so the attention op can read the unrepeated tensors;
the copy is then dead unless something else (a saved tensor for the backward) still reads it.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten
_ATTENTION = (aten._scaled_dot_product_flash_attention_for_cpu.default,)
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _shape(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _repeated_source(node):
    """x when `node` is x (B, Hkv, S, E) repeated to (B, Hkv * rep, S, E) by unsqueeze(2), expand,
    clone and a reshape; else None."""
    out = _shape(node)
    if out is None or len(out) != 4 or not isinstance(node, torch.fx.Node):
        return None
    while node.op == "call_function" and node.target in _RESHAPES:
        node = node.args[0]
    if node.op != "call_function" or node.target is not aten.clone.default:
        return None
    node = node.args[0]
    if node.op != "call_function" or node.target is not aten.expand.default:
        return None
    node = node.args[0]
    if node.op != "call_function" or node.target is not aten.unsqueeze.default or node.args[1] not in (2, -3):
        return None
    src = node.args[0]
    shape = _shape(src)
    if shape is None or len(shape) != 4:
        return None
    b, hkv, s, e = shape
    if out[0] != b or out[2:] != (s, e) or out[1] % hkv or out[1] == hkv:
        return None
    return src


def unrepeat_kv(gm: torch.fx.GraphModule) -> int:
    """Point attention ops at the unrepeated keys/values; returns how many inputs were rewritten."""
    changed = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in _ATTENTION:
            continue
        q_shape = _shape(node.args[0])
        args = list(node.args)
        for i in (1, 2):
            src = _repeated_source(args[i])
            if src is not None and q_shape is not None and q_shape[1] == _shape(args[i])[1]:
                args[i] = src
                changed += 1
        node.args = tuple(args)
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return changed
