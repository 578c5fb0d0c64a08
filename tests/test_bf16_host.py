"""bfloat16/float16 products on the host (XLA:CPU): a matrix-vector product gains a row of zeros so that
XLA:CPU takes its half-precision library dot instead of converting the whole weight to float32 at
every call (ops/linalg.py `_host_half_matmul`). Results against torch CPU within half-precision
tolerance, eager and compiled, for every product shape a decoder makes; the same lowering traced for
a TPU keeps its bf16 dots native. Float32 products under `torch.set_float32_matmul_precision("medium")`
take bf16 operands on the host (ops/linalg.py `_host_bf16_passes`)."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import torchtpu  # noqa: F401  (the tpu device)
from torchtpu.device import platform
from torchtpu.ops import linalg

HALF = [torch.bfloat16, torch.float16]


def _pair(*shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    cpu = torch.randn(*shape, generator=g).to(dtype)
    return cpu, cpu.to("tpu")


def _close(tpu, cpu):
    # the CPU and XLA both accumulate in float32 and round once; summation order differs
    assert tpu.dtype == cpu.dtype and tpu.shape == cpu.shape
    assert_close(tpu.cpu().float(), cpu.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("rows", [1, 3])
def test_linear_transposed_weight(dtype, rows):
    x, xt = _pair(rows, 256, dtype=dtype, seed=1)
    w, wt = _pair(384, 256, dtype=dtype, seed=2)
    b, bt = _pair(384, dtype=dtype, seed=3)
    _close(xt @ wt.T, x @ w.T)  # mm of the view W.t()
    _close(F.linear(xt, wt, bt), F.linear(x, w, b))  # addmm
    _close(F.linear(xt[None], wt), F.linear(x[None], w))  # a 3-D input: matmul's reshape, then mm


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize(
    "a_shape,b_shape",
    [
        ((1, 64), (64, 96)),  # one row, row-major weight
        ((5, 64), (64, 1)),  # one column
        ((1, 64), (64, 1)),  # both
        ((64,), (64, 96)),  # vector @ matrix
        ((96, 64), (64,)),  # mv
        ((64,), (64,)),  # dot
        ((4, 1, 64), (4, 64, 48)),  # bmm, one row per batch (attention's p @ v at decode)
        ((4, 3, 64), (4, 64, 48)),
        ((2, 4, 1, 64), (64, 48)),  # a batch broadcast against one matrix
    ],
)
def test_matmul_shapes(dtype, a_shape, b_shape):
    a, at = _pair(*a_shape, dtype=dtype, seed=4)
    b, bt = _pair(*b_shape, dtype=dtype, seed=5)
    _close(at @ bt, a @ b)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("q_len", [1, 4])
def test_batched_keys_transposed(dtype, q_len):
    q, qt = _pair(2, 8, q_len, 64, dtype=dtype, seed=6)
    k, kt = _pair(2, 8, 40, 64, dtype=dtype, seed=7)
    _close(qt @ kt.transpose(-2, -1), q @ k.transpose(-2, -1))
    _close(
        torch.bmm(qt.flatten(0, 1), kt.flatten(0, 1).transpose(1, 2)),
        torch.bmm(q.flatten(0, 1), k.flatten(0, 1).transpose(1, 2)),
    )


@pytest.mark.parametrize("dtype", HALF)
def test_addmm_baddbmm_addmv_scaled(dtype):
    c, ct = _pair(1, 96, dtype=dtype, seed=8)
    a, at = _pair(1, 64, dtype=dtype, seed=9)
    b, bt = _pair(64, 96, dtype=dtype, seed=10)
    _close(torch.addmm(ct, at, bt, beta=0.5, alpha=2.0), torch.addmm(c, a, b, beta=0.5, alpha=2.0))
    v, vt = _pair(64, dtype=dtype, seed=11)
    m, mt = _pair(96, 64, dtype=dtype, seed=12)
    _close(torch.addmv(ct[0], mt, vt, beta=0.5), torch.addmv(c[0], m, v, beta=0.5))
    c3, c3t = _pair(3, 1, 96, dtype=dtype, seed=13)
    a3, a3t = _pair(3, 1, 64, dtype=dtype, seed=14)
    b3, b3t = _pair(3, 64, 96, dtype=dtype, seed=15)
    _close(torch.baddbmm(c3t, a3t, b3t), torch.baddbmm(c3, a3, b3))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("transposed", [False, True])
def test_convolution(dtype, transposed):
    x, xt = _pair(2, 8, 10, 10, dtype=dtype, seed=16)
    w, wt = _pair(8, 6, 3, 3, dtype=dtype, seed=17)
    b, bt = _pair(6, dtype=dtype, seed=18)
    # the reference: the CPU's convolution of the same values in float32, rounded once. The CPU's own
    # half-precision convolution accumulates in float32 only through oneDNN's bf16/fp16 path, which
    # CPUs without AVX512 lack (there its transposed bf16 result is 0.1 off the rounded float32 one)
    x, w, b = x.float(), w.float(), b.float()
    if transposed:
        _close(F.conv_transpose2d(xt, wt, bt, stride=2), F.conv_transpose2d(x, w, b, stride=2).to(dtype))
    else:
        _close(
            F.conv2d(xt, wt.transpose(0, 1).contiguous(), bt, padding=1),
            F.conv2d(x, w.transpose(0, 1).contiguous(), b, padding=1).to(dtype),
        )


def test_backward_of_a_one_row_linear():
    x, xt = _pair(1, 128, dtype=torch.bfloat16, seed=19)
    w, wt = _pair(64, 128, dtype=torch.bfloat16, seed=20)
    x.requires_grad_(), w.requires_grad_(), xt.requires_grad_(), wt.requires_grad_()
    F.linear(x, w).float().square().sum().backward()
    F.linear(xt, wt).float().square().sum().backward()
    _close(xt.grad, x.grad)
    _close(wt.grad, w.grad)


def test_compiled_decode_shaped_mlp():
    torch.manual_seed(21)
    cpu = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.SiLU(), torch.nn.Linear(512, 256)).to(torch.bfloat16)
    tpu = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.SiLU(), torch.nn.Linear(512, 256)).to(torch.bfloat16)
    tpu.load_state_dict(cpu.state_dict())
    tpu = tpu.to("tpu")
    compiled = torch.compile(tpu, backend="tpu")
    for rows in (1, 4):
        x, xt = _pair(1, rows, 256, dtype=torch.bfloat16, seed=22 + rows)
        with torch.no_grad():
            _close(compiled(xt), cpu(x))


# --- the lowering's form: padded on the host, native bf16 when traced for a TPU


def _dots(fn, *args):
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    return [e for e in jaxpr.eqns if e.primitive is jax.lax.dot_general_p]


def _linear_one_row():
    # a new function per trace: JAX caches a function's trace per argument types, which would hand
    # a trace made for one platform to the other
    return lambda x, w: linalg.matmul(x, w.T)


@pytest.mark.parametrize("dtype,n", [(jnp.float16, 384), (jnp.bfloat16, 96)])  # bf16: below host_gemv's size
def test_host_trace_pads_a_one_row_product(dtype, n):
    x, w = jnp.ones((1, 256), dtype), jnp.ones((n, 256), dtype)
    with platform.tracing_for("cpu"):
        (dot,) = _dots(_linear_one_row(), x, w)
    lhs, rhs = (v.aval for v in dot.invars)
    assert lhs.shape == (2, 256) and lhs.dtype == dtype and rhs.shape == (n, 256)  # W as stored
    assert dot.params["preferred_element_type"] == jnp.float32


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_tpu_trace_keeps_half_dots_native(dtype):
    x, w = jnp.ones((1, 256), dtype), jnp.ones((384, 256), dtype)
    q, k = jnp.ones((4, 1, 64), dtype), jnp.ones((4, 40, 64), dtype)
    with platform.tracing_for("tpu"):
        (dot,) = _dots(_linear_one_row(), x, w)
        (bdot,) = _dots(lambda q, k: linalg.matmul(q, jnp.swapaxes(k, -1, -2)), q, k)
        hlo = jax.jit(_linear_one_row()).lower(x, w).as_text()
    for d, lhs_shape in ((dot, (1, 256)), (bdot, (4, 1, 64))):
        lhs, rhs = (v.aval for v in d.invars)
        assert lhs.shape == lhs_shape and lhs.dtype == dtype and rhs.dtype == dtype  # no zero row
    assert dot.params["preferred_element_type"] == jnp.float32  # f32 accumulation, rounded once
    name = {jnp.bfloat16: "bf16", jnp.float16: "f16"}[dtype]
    assert f"tensor<1x256x{name}>, tensor<384x256x{name}>) -> tensor<1x384xf32>" in hlo
    assert "concatenate" not in hlo


def test_float32_is_not_padded():
    x, w = jnp.ones((1, 256), jnp.float32), jnp.ones((384, 256), jnp.float32)
    with platform.tracing_for("cpu"):
        (dot,) = _dots(_linear_one_row(), x, w)
    assert dot.invars[0].aval.shape == (1, 256)  # XLA:CPU's float32 GEMV is its fastest form


# --- float32 products under torch.set_float32_matmul_precision("medium"): bf16 operands on the host


@pytest.fixture
def matmul_precision():
    previous = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(previous)


def _bf16_product(a, b):
    """What "medium" computes: the operands rounded to bf16, the sum of products in (at least) float32."""
    return (a.bfloat16().double() @ b.bfloat16().double()).float()


@pytest.mark.parametrize("compiled", [False, True])
def test_medium_precision_runs_float32_products_with_bf16_operands(matmul_precision, compiled):
    a, at = _pair(3, 96, 256, dtype=torch.float32, seed=30)
    w, wt = _pair(384, 256, dtype=torch.float32, seed=31)
    b, bt = _pair(384, dtype=torch.float32, seed=32)

    def products(x, weight, bias):
        return F.linear(x, weight, bias), x @ weight.T, torch.bmm(x, weight.T.expand(3, -1, -1))

    fn = torch.compile(products, backend="tpu") if compiled else products
    wants = [_bf16_product(a, w.T) + b, _bf16_product(a, w.T), _bf16_product(a, w.T)]
    for setting, bf16 in (("medium", True), ("highest", False), ("high", False)):
        matmul_precision(setting)
        for got, want, exact in zip(fn(at, wt, bt), wants, products(a, w, b)):
            assert got.dtype == torch.float32
            if bf16:  # rounded operands, float32 sums: far from the float32 product (~1e-1), close to this
                assert_close(got.cpu(), want, atol=1e-4, rtol=1e-4)
                assert (got.cpu() - exact).abs().max() > 1e-2
            else:
                assert_close(got.cpu(), exact, atol=1e-4, rtol=1e-4)


def test_medium_precision_keeps_small_and_one_row_float32_products_exact(matmul_precision):
    matmul_precision("medium")
    for a_shape, b_shape in (((1, 512), (512, 4096)), ((512, 1024), (1024, 1)), ((8, 16), (16, 8))):
        a, at = _pair(*a_shape, dtype=torch.float32, seed=33)
        b, bt = _pair(*b_shape, dtype=torch.float32, seed=34)
        assert_close((at @ bt).cpu(), a @ b, atol=1e-4, rtol=1e-4)


def test_medium_precision_backward_products_stay_bf16_dots(matmul_precision):
    """The backward of a linear layer multiplies by t(t(W)) and by t(dY): its bf16 passes contract the
    untransposed arrays (XLA:CPU turned convert(transpose(W)) into a float32 dot plus two conversions),
    and dY.T @ X, which XLA:CPU has no bf16 dot for, stays float32."""
    matmul_precision("medium")
    x, xt = _pair(192, 256, dtype=torch.float32, seed=35)
    w, wt = _pair(384, 256, dtype=torch.float32, seed=36)
    dy, dyt = _pair(192, 384, dtype=torch.float32, seed=37)

    def grads(x, w, dy):
        return dy @ w.t().t(), dy.t() @ x

    got_dx, got_dw = torch.compile(grads, backend="tpu")(xt, wt, dyt)
    assert_close(got_dx.cpu(), _bf16_product(dy, w), atol=1e-4, rtol=1e-4)
    assert_close(got_dw.cpu(), dy.t() @ x, atol=1e-4, rtol=1e-4)
    a, b = jnp.asarray(dy.numpy()), jnp.asarray(w.numpy())
    with platform.tracing_for("cpu"):
        (dx_dot,) = _dots(lambda a, b: linalg.matmul(a, b.T.T), a, b)
        (dw_dot,) = _dots(lambda a, b: linalg.matmul(a.T, b), a, a)
        hlo = jax.jit(lambda a, b: linalg.matmul(a, b.T.T)).lower(a, b).compile().as_text()
    assert [v.aval.dtype for v in dx_dot.invars] == [jnp.bfloat16, jnp.bfloat16]
    assert dx_dot.params["dimension_numbers"][0] == ((1,), (0,))  # on W itself, no transpose
    assert [v.aval.dtype for v in dw_dot.invars] == [jnp.float32, jnp.float32]
    assert "convert_convert" not in hlo


def test_medium_precision_trace_for_tpu_keeps_float32_operands(matmul_precision):
    matmul_precision("medium")
    a, b = jnp.ones((256, 256), jnp.float32), jnp.ones((256, 512), jnp.float32)
    with platform.tracing_for("cpu"):
        (host,) = _dots(lambda a, b: linalg.matmul(a, b), a, b)
    with platform.tracing_for("tpu"):
        (tpu,) = _dots(lambda a, b: linalg.matmul(a, b), a, b)
    assert [v.aval.dtype for v in host.invars] == [jnp.bfloat16, jnp.bfloat16]
    assert host.params["preferred_element_type"] == jnp.float32
    # on a TPU one bf16 pass is XLA's DEFAULT precision of a float32 dot: no casts in the program
    assert [v.aval.dtype for v in tpu.invars] == [jnp.float32, jnp.float32]
    assert tpu.params["precision"] in (None, (jax.lax.Precision.DEFAULT, jax.lax.Precision.DEFAULT))


# --- loading: a memory-mapped checkpoint's pages are given back once on the device (device/host_pages.py)


def _resident_pages(t):
    from torchtpu.device.host_pages import _PAGE, _PRESENT

    start = -(-t.data_ptr() // _PAGE) * _PAGE
    end = (t.data_ptr() + t.nbytes) // _PAGE * _PAGE
    with open("/proc/self/pagemap", "rb", buffering=0) as f:
        f.seek(start // _PAGE * 8)
        entries = np.frombuffer(f.read((end - start) // _PAGE * 8), np.uint64)
    return int(((entries & _PRESENT) != 0).sum())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/pagemap")
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mapped_checkpoint_pages_are_given_back(tmp_path, monkeypatch, chunked, dtype):
    from safetensors import safe_open
    from safetensors.torch import save_file

    from torchtpu.device import host_pages

    if chunked:  # (the chunked path for a tensor larger than a chunk, at a test's size)
        monkeypatch.setattr(host_pages, "CHUNK_BYTES", 1 << 20)
    g = torch.Generator().manual_seed(30)
    weights = {"w": torch.randn(1237, 1031, generator=g).to(dtype), "b": torch.randn(7, generator=g).to(dtype)}
    save_file(weights, str(tmp_path / "m.safetensors"))
    with safe_open(str(tmp_path / "m.safetensors"), framework="pt", device="cpu") as f:
        w, b = f.get_tensor("w"), f.get_tensor("b")
        w.float().sum()  # resident, as a loader's reads make it
        assert _resident_pages(w) > 0
        wt, bt = w.to("tpu"), b.to("tpu")
        assert _resident_pages(w) <= 2  # given back (a page at a chunk seam may stay)
        assert_close(wt.cpu(), weights["w"], rtol=0, atol=0)
        assert_close(bt.cpu(), weights["b"], rtol=0, atol=0)
        assert_close(w, weights["w"], rtol=0, atol=0)  # the source still reads its values (from the file)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/pagemap")
def test_written_mapped_pages_and_anonymous_memory_are_kept(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    save_file({"w": torch.randn(600, 1000)}, str(tmp_path / "m.safetensors"))
    with safe_open(str(tmp_path / "m.safetensors"), framework="pt", device="cpu") as f:
        w = f.get_tensor("w")
        w[300:] += 1  # copy-on-write pages of the private mapping: this process's only copy
        expected = w.clone()
        resident = _resident_pages(w)
        assert_close(w.to("tpu").cpu(), expected, rtol=0, atol=0)
        assert _resident_pages(w) == resident
        assert_close(w, expected, rtol=0, atol=0)
    x = torch.randn(600, 1000)
    resident = _resident_pages(x)
    assert_close(x.to("tpu").cpu(), x, rtol=0, atol=0)
    assert _resident_pages(x) == resident


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/pagemap")
def test_staged_weight_is_the_device_buffer_and_independent(tmp_path, monkeypatch):
    # a large mapped weight is staged in populated pages the device buffer adopts (device/host_pages.py)
    from safetensors import safe_open
    from safetensors.torch import save_file

    from torchtpu.device import host_pages, platform
    from torchtpu.storage.records import record_of

    monkeypatch.setattr(host_pages, "CHUNK_BYTES", 1 << 20)
    staged = []
    real = host_pages._staging
    monkeypatch.setattr(host_pages, "_staging", lambda n: staged.append(real(n)) or staged[-1])
    save_file({"w": torch.randn(900, 700, generator=torch.Generator().manual_seed(31))}, str(tmp_path / "m.st"))
    with safe_open(str(tmp_path / "m.st"), framework="pt", device="cpu") as f:
        w = f.get_tensor("w")
        expected = w.clone()
        wt = w.to("tpu")
        assert len(staged) == 1 and staged[0].nbytes == w.nbytes
        if platform.buffers_in_host_memory():  # adopted, not copied again
            assert record_of(wt).buffer.unsafe_buffer_pointer() == staged[0].__array_interface__["data"][0]
        wt.mul_(3).add_(1)
        assert_close(wt.cpu(), expected * 3 + 1)
        assert_close(w, expected, rtol=0, atol=0)


def _reads_recorded(monkeypatch):
    from torchtpu.device import host_pages

    reads = []
    real = host_pages._read_file
    monkeypatch.setattr(host_pages, "_read_file", lambda buf, where: reads.append(real(buf, where)) or reads[-1])
    return reads


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mapped_weight_is_read_from_its_file(tmp_path, monkeypatch, dtype):
    # a large weight of a mapped checkpoint is read from the file into the staged pages (no faults in
    # the loader's mapping: device/host_pages.py `_read_file`), unless the file or its pages changed
    from safetensors import safe_open
    from safetensors.torch import save_file

    from torchtpu.device import platform

    reads = _reads_recorded(monkeypatch)
    g = torch.Generator().manual_seed(33)
    weights = {k: torch.randn(731, 997, generator=g).to(dtype) for k in ("a", "b", "c", "d")}
    path = str(tmp_path / "m.safetensors")
    save_file(weights, path)
    with safe_open(path, framework="pt", device="cpu") as f:
        a, b, c, d = (f.get_tensor(k) for k in "abcd")
        at = a.to("tpu")
        assert_close(at.cpu(), weights["a"], rtol=0, atol=0)
        assert reads == ([True] if platform.buffers_in_host_memory() else [])
        b[-1, -1] = 7  # written into b's last page: that page's file bytes are no longer b's
        assert_close(b.to("tpu").cpu(), b, rtol=0, atol=0)
        c.view(-1)[0] = -3  # c's first page is b's last: written too
        assert_close(c.to("tpu").cpu(), c, rtol=0, atol=0)
        assert len(reads) == len([r for r in reads if r]) <= 1
        save_file({k: -v for k, v in weights.items()}, path)  # a new file at the path: d still maps the old one
        assert_close(d.to("tpu").cpu(), weights["d"], rtol=0, atol=0)
        assert True not in reads[1:]
        at.add_(1)  # the device copy is its own
        assert_close(a, weights["a"], rtol=0, atol=0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps")
def test_tiny_model_from_pretrained_on_tpu_equals_cpu(tmp_path, monkeypatch):
    # the loading path at a test's size: every weight equal to torch CPU's, the large ones read from the file
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from torchtpu.device import host_pages, platform

    reads = _reads_recorded(monkeypatch)
    config = LlamaConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(34)
    large = 0
    for dtype in (torch.bfloat16, torch.float32):
        LlamaForCausalLM(config).to(dtype).save_pretrained(tmp_path / str(dtype))
        cpu = AutoModelForCausalLM.from_pretrained(tmp_path / str(dtype), dtype=dtype, device_map="cpu")
        tpu = AutoModelForCausalLM.from_pretrained(tmp_path / str(dtype), dtype=dtype, device_map="tpu")
        expected = cpu.state_dict()
        for name, value in tpu.state_dict().items():
            assert value.device.type == "tpu"
            assert_close(value.cpu(), expected[name], rtol=0, atol=0)
        large += sum(v.nbytes >= host_pages.STAGE_BYTES for v in expected.values())
    assert reads == ([True] * large if platform.buffers_in_host_memory() else [])


@pytest.mark.parametrize(
    ("src", "dst"), [(torch.bfloat16, torch.float32), (torch.float32, torch.float16), (torch.float64, torch.bfloat16)]
)
def test_converting_copy_to_the_device_is_the_cpus_conversion(src, dst):
    # a large float-to-float `.to("tpu", dtype)` is converted by torch CPU into the pages the device
    # buffer adopts (device/host_pages.py put_converted); small ones on the device
    g = torch.Generator().manual_seed(32)
    # (a small float64 source converts on the device, whose float64 conversions flush denormals: not here)
    for shape in [(700, 900), (3, 5)] if src != torch.float64 else [(700, 900)]:
        x = (torch.randn(shape, generator=g) * 1e3).to(src)
        x.view(-1)[:4] = torch.tensor([float("inf"), float("nan"), 1e-40, -0.0]).to(src)
        y = x.to("tpu", dst)
        assert y.dtype == dst
        assert_close(y.cpu(), x.to(dst), rtol=0, atol=0, equal_nan=True)
        y.mul_(2)  # the device copy is its own: the source keeps its values (XLA:CPU's product flushes denormals)
        assert_close(y.cpu().view(-1)[3:], (x.to(dst) * 2).view(-1)[3:], rtol=0, atol=0, equal_nan=True)
        assert_close(x.view(-1)[3], torch.tensor(-0.0, dtype=src), rtol=0, atol=0)
    view = torch.randn(900, 800, generator=g).to(src)[:, ::2]  # not contiguous
    assert_close(view.to("tpu", dst).cpu(), view.to(dst), rtol=0, atol=0)
    param = torch.nn.Parameter(torch.randn(800, 700, generator=g).to(src))  # (autograd's view of the copy)
    moved = param.to("tpu", dst)
    assert moved.requires_grad
    assert_close(moved.detach().cpu(), param.detach().to(dst), rtol=0, atol=0)


# --- one position written into a half-precision array (a static KV cache) on the host: a select, not a
# scatter XLA:CPU would run in float32 over the whole array (ops/indexing.py `_select_one`)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("compiled", [False, True])
def test_one_position_written_into_a_half_cache(dtype, compiled):
    # large enough to be written by a flat scatter (indexing.FLAT_SCATTER_MIN), or now the select
    cache, cache_t = _pair(1, 4, 128, 64, dtype=dtype, seed=40)
    k, kt = _pair(1, 4, 1, 64, dtype=dtype, seed=41)
    k2, k2t = _pair(1, 4, 2, 64, dtype=dtype, seed=42)

    def update(c, k, k2, position):
        c.index_copy_(2, position, k)  # transformers' StaticCache
        c[:, :, 7] = k[:, :, 0] * 2  # a select_scatter in the graph
        c[:, :, 9:10] = k + 1  # a slice_scatter of one position
        c.index_copy_(2, torch.tensor([20, 3], device=c.device), k2)  # two positions: the scatter
        return c * 1

    fn = torch.compile(update, backend="tpu") if compiled else update
    for position in (0, 37, 127):
        where = torch.tensor([position])
        want = update(cache, k, k2, where)
        got = fn(cache_t, kt, k2t, where.to("tpu"))
        assert_close(got.cpu(), want, atol=0, rtol=0)
        assert_close(cache_t.cpu(), cache, atol=0, rtol=0)


def test_one_position_trace_is_a_select_on_the_host_only():
    from torchtpu.ops import indexing

    def written(x, k, position):
        return indexing.flat_set(x, 2, position, k)

    def program(dtype, platform_name):
        x, k = jnp.ones((1, 4, 4096, 32), dtype), jnp.ones((1, 4, 1, 32), dtype)
        with platform.tracing_for(platform_name):
            # (a new function per trace: JAX caches traces per argument types, not per platform)
            return jax.jit(lambda *a: written(*a)).lower(x, k, jnp.array([5])).as_text()

    host = program(jnp.bfloat16, "cpu")
    assert "stablehlo.scatter" not in host and "stablehlo.select" in host
    assert "stablehlo.scatter" in program(jnp.bfloat16, "tpu")  # native there
    assert "stablehlo.scatter" in program(jnp.float32, "cpu")  # XLA:CPU updates float32 in place
    # out of range: nothing written, as the scatter's "drop" (index_copy checks its indices before)
    x = jnp.arange(2 * 3 * 5, dtype=jnp.float32).reshape(1, 2, 5, 3).astype(jnp.bfloat16)
    with platform.tracing_for("cpu"):
        same = jax.jit(written)(x, jnp.zeros((1, 2, 1, 3), jnp.bfloat16), jnp.array([5]))
    assert (np.asarray(same.astype(jnp.float32)) == np.asarray(x.astype(jnp.float32))).all()


# --- attention of one query row (a decode step) over a half KV cache: a zero row on the host


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("kv_heads", [16, 8])  # 8: grouped heads, already two rows per key/value head
@pytest.mark.parametrize("compiled", [False, True])
def test_one_query_row_attention(dtype, kv_heads, compiled):
    q, qt = _pair(1, 16, 1, 64, dtype=dtype, seed=40)
    k, kt = _pair(1, kv_heads, 300, 64, dtype=dtype, seed=41)
    v, vt = _pair(1, kv_heads, 300, 64, dtype=dtype, seed=42)
    mask = (torch.arange(300) < 250).view(1, 1, 1, 300)  # a static cache's unwritten positions masked out
    fn = F.scaled_dot_product_attention
    gqa = kv_heads != 16
    tfn = torch.compile(fn, backend="tpu") if compiled else fn
    _close(tfn(qt, kt, vt, attn_mask=mask.to("tpu"), enable_gqa=gqa), fn(q, k, v, attn_mask=mask, enable_gqa=gqa))


def test_one_query_row_attention_trace_pads_on_the_host_only():
    from torchtpu.ops.attention import sdpa_fused

    q, k = jnp.ones((1, 16, 1, 64), jnp.bfloat16), jnp.ones((1, 16, 300, 64), jnp.bfloat16)
    for target, rows in (("cpu", 2), ("tpu", 1)):
        with platform.tracing_for(target):
            dots = _dots(lambda q, k, v: sdpa_fused(q, k, v)[0], q, k, k)
        assert {d.invars[0].aval.shape[-2] for d in dots[:1]} == {rows}
