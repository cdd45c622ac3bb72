"""templates/noise.cuh.tmpl, the sampler's noise on the device, against
klgen.reference (docs/design/sampling.md): a spec's rendered source with a
test kernel, compiled through CuPy's NVRTC, gives reference.bits and
reference.uniform bit for bit, and on CUDA reference.noise bit for bit too
(both take CUDA's logf); the CPU reference's logs are torch's own, so its g is
held within 2 ulp of each log instead.

Skipped without torch, a CUDA device or CuPy. tests/sample/gpu_noise.c checks the
same kernels compiled as klgen's JIT compiles them, against a host Philox.
"""

import math
import os
import random

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import klgen  # noqa: E402
from klgen import reference  # noqa: E402

pytestmark = pytest.mark.gpu

SPEC = "gpt2_tp4"  # any spec: the noise does not depend on it

# gen/compile.c's options, besides the arch: what klgen's JIT passes. CuPy
# adds -ftz=true to every compile, which the JIT does not: logf is then the
# same instructions with .ftz, and for u >= 2^-24 none of their operands or
# results is subnormal, so the bits are the same.
NVRTC_OPTIONS = ("-std=c++17", "-lineinfo")

# After the spec's source, whose names are in namespace kl_<spec> (u32 and
# u64 are memory.cuh.tmpl's); one thread a (seed, offset, column).
KERNEL = r"""
using namespace kl_%(name)s;
extern "C" __global__ void noise_test(const u64 *seed, const u64 *offset, const u64 *column,
                                      int n, u32 *word, float *u, float *inner, float *g) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const u32 x = noise_word(seed[i], offset[i], column[i]);
  word[i] = x;
  u[i] = noise_uniform(x);
  inner[i] = -logf(noise_uniform(x));
  g[i] = gumbel(x);
}
"""

EDGE_SEEDS = [0, 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1]
EDGE_OFFSETS = [0, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 2, 2**64 - 1]
EDGE_COLUMNS = [0, 1, 2, 3, 4, 5, 6, 7, 2**32 - 1, 2**32, 2**34 + 3, 2**34 + 4, 152063,
                163839, 2**62]


def noise_source(out_dir):
    """The spec's generated .cu (klgen.generate, as the `klgen` command
    writes it) with the test kernel after it."""
    written = klgen.generate(SPEC, out_dir)
    cu = next(p for p in written if p.endswith(".cu"))
    with open(cu) as f:
        source = f.read()
    return source + KERNEL % {"name": os.path.basename(cu)[:-3]}


@pytest.fixture(scope="module")
def cp():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    return pytest.importorskip("cupy")


@pytest.fixture(scope="module")
def kernel(cp, tmp_path_factory):
    source = noise_source(str(tmp_path_factory.mktemp("noise")))
    return cp.RawKernel(source, "noise_test", options=NVRTC_OPTIONS)


def as_i64(values):
    """ints in [0, 2^64) as int64 (two's complement), as the reference takes them."""
    return torch.tensor([v - 2**64 if v >= 2**63 else v for v in values], dtype=torch.int64)


def cases():
    """Rows of (seed, offset), every edge pair and random ones, and the
    columns each row draws: the edges, a vocabulary's first 20000, random ones."""
    rng = random.Random(22)
    pairs = [(s, o) for s in EDGE_SEEDS for o in EDGE_OFFSETS]
    pairs += [(rng.randrange(2**64), rng.randrange(2**64)) for _ in range(28)]
    columns = EDGE_COLUMNS + list(range(8, 20000)) + [rng.randrange(2**40) for _ in range(4096)]
    return pairs, columns


def run(cp, kernel, pairs, columns):
    """The kernel's word, u, -logf(u) and g of every (row, column): numpy
    [rows, columns] arrays."""
    rows, ncols = len(pairs), len(columns)
    seed = np.repeat(np.array([s for s, _ in pairs], dtype=np.uint64), ncols)
    offset = np.repeat(np.array([o for _, o in pairs], dtype=np.uint64), ncols)
    column = np.tile(np.array(columns, dtype=np.uint64), rows)
    n = rows * ncols
    args = [cp.asarray(a) for a in (seed, offset, column)]
    outs = [cp.empty(n, dtype=dt) for dt in (cp.uint32, cp.float32, cp.float32, cp.float32)]
    block = 256
    kernel(((n + block - 1) // block,), (block,), (*args, np.int32(n), *outs))
    return [o.get().reshape(rows, ncols) for o in outs]


def reference_of(fn, pairs, columns, device):
    seeds, offsets = as_i64([s for s, _ in pairs]), as_i64([o for _, o in pairs])
    cols = torch.tensor(columns, dtype=torch.int64)
    return fn(seeds, offsets, cols, device=device).cpu().numpy()


def bits_of(a):
    return a.view(np.uint32)


def assert_words_and_uniforms(pairs, columns, word, u, device):
    """The reference's Philox words and uniforms on device: the kernel's, bit for bit."""
    assert np.array_equal(reference_of(reference.bits, pairs, columns, device), word)
    assert np.array_equal(bits_of(reference_of(reference.uniform, pairs, columns, device)),
                          bits_of(u))


def test_kernel_is_the_reference_on_cuda(cp, kernel):
    pairs, columns = cases()
    word, u, _, g = run(cp, kernel, pairs, columns)
    assert_words_and_uniforms(pairs, columns, word, u, "cuda")
    want = reference_of(reference.noise, pairs, columns, "cuda")
    same = bits_of(want) == bits_of(g)
    assert same.all(), (f"{(~same).sum()} of {same.size} g differ, e.g. u {u[~same][:4]}: "
                        f"kernel {g[~same][:4]}, reference {want[~same][:4]}")


def ulp(a):
    """The gap from each |a| (float32) to the next float32 up, in float64."""
    a = np.abs(a.astype(np.float32))
    return (np.nextafter(a, np.float32(math.inf)) - a).astype(np.float64)


def test_cpu_reference_against_the_kernel(cp, kernel):
    """Bits and u bit for bit; g within 2 ulp of g, plus what 2 ulp of the
    inner log -log(u) makes of g (dg = dL / L): near g = 0 one ulp of L is
    many of g, and the CPU's log may round L the other way from CUDA's."""
    pairs, columns = cases()
    word, u, inner, g = run(cp, kernel, pairs, columns)
    assert_words_and_uniforms(pairs, columns, word, u, "cpu")
    want = reference_of(reference.noise, pairs, columns, "cpu")
    assert np.isfinite(want).all() and np.isfinite(g).all()
    tol = 2 * ulp(g) + 2 * ulp(inner) / inner.astype(np.float64)
    err = np.abs(want.astype(np.float64) - g.astype(np.float64))
    bad = err > tol
    assert not bad.any(), (f"{bad.sum()} of {bad.size} g off, e.g. u {u[bad][:4]}: "
                           f"kernel {g[bad][:4]}, reference {want[bad][:4]}")
