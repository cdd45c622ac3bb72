"""The Python package without a GPU: spec queries, generation, errors, arguments."""

import importlib
import os
import subprocess
import sys
import time

import pytest

import klgen

KIMI = klgen.spec_path("kimi_k3_tp8")
GOOD = "return { name = 'm', vocab_size = 50257, tp = 4, dtype = 'fp16', max_tokens = 8 }"


def test_version_and_layout():
    assert klgen.__version__ == "0.1.0"
    assert os.path.isdir(klgen.SPECS_DIR)
    assert os.path.exists(os.path.join(klgen.SPECS_DIR, "README.md"))


def test_spec_info_from_a_file():
    info = klgen.spec_info(KIMI)
    assert info == klgen.SpecInfo("kimi_k3_tp8", 163840, 163840, 20480, 8, "bf16", 64,
                                  info.buffer_bytes, "bf16")
    # three rotating buffers of tp x max_tokens rows, for the logits and for
    # argmax's candidate records (10 CTAs a row, one 16-byte record each), then
    # the group's 64-byte fault word
    assert info.buffer_bytes == 3 * 8 * 64 * (20480 * 2 + 10 * 16) + 64


def test_spec_info_from_source_and_by_name():
    info = klgen.spec_info(source=GOOD)
    assert (info.name, info.padded_vocab, info.shard, info.dtype) == ("m", 50304, 12576, "fp16")
    ds = klgen.spec_path("deepseek_v3")
    assert klgen.spec_info(ds, "deepseek_v3_tp4").tp == 4
    with pytest.raises(ValueError, match="defines 3 specs; pass the name of one: deepseek_v3_tp2, "
                                         "deepseek_v3_tp4, deepseek_v3_tp8$"):
        klgen.spec_info(ds)
    with pytest.raises(ValueError, match="no spec named 'nope' in it; it defines deepseek_v3_tp2, "
                                         "deepseek_v3_tp4, deepseek_v3_tp8$"):
        klgen.spec_info(ds, name="nope")
    # a shipped spec's own name stands for that spec of its file
    assert klgen.spec_info("deepseek_v3_tp4").tp == 4
    assert klgen.spec_info("deepseek_v3_tp8", name="deepseek_v3_tp8").tp == 8
    with pytest.raises(ValueError, match="differ"):
        klgen.spec_info("deepseek_v3_tp8", name="deepseek_v3_tp2")
    assert klgen.spec_path("deepseek_v3_tp4") == ds
    assert klgen.spec_names("deepseek_v3_tp4") == ["deepseek_v3_tp4"]


def test_epilogue_fields():
    info = klgen.spec_info(source="return { name = 'g', vocab_size = 256000, tp = 8, "
                                  "dtype = 'bf16', max_tokens = 8, out_dtype = 'fp32', softcap = 30.0 }")
    assert (info.dtype, info.out_dtype) == ("bf16", "fp32")
    for bad, field in (("softcap = 0", "softcap"), ("softcap = -1", "softcap"),
                       ("softcap = 'x'", "softcap"), ("out_dtype = 'fp16'", "out_dtype"),
                       ("numerics = 'fast'", "numerics"), ("scale = 0", "scale")):
        with pytest.raises(klgen.SpecError) as e:
            klgen.spec_info(source="return { name = 'g', vocab_size = 256, tp = 1, "
                                   f"dtype = 'bf16', max_tokens = 1, {bad} }}")
        assert e.value.field == field, (bad, str(e.value))


def test_topk_field():
    info = klgen.spec_info(source="return { name = 'k', vocab_size = 163840, tp = 8, "
                                  "dtype = 'bf16', max_tokens = 64, topk = 8 }")
    assert info.topk == 8 and klgen.spec_info(source=GOOD).topk == 0
    for bad in ("topk = 0", "topk = 65", "topk = 1.5", "topk = '8'", "topk = 300"):
        with pytest.raises(klgen.SpecError) as e:
            klgen.spec_info(source="return { name = 'g', vocab_size = 256, tp = 1, "
                                   f"dtype = 'bf16', max_tokens = 1, {bad} }}")
        assert e.value.field == "topk", (bad, str(e.value))


def test_spec_names():
    assert klgen.spec_names(klgen.spec_path("deepseek_v3")) == [
        "deepseek_v3_tp2", "deepseek_v3_tp4", "deepseek_v3_tp8"]
    assert klgen.spec_names(source=GOOD) == ["m"]


def test_spec_error_fields(tmp_path):
    bad = tmp_path / "bad.lua"
    bad.write_text("return {\n  name = 'bad',\n  vocab_size = 50257,\n  tp = 5,\n"
                   "  dtype = 'bf16', max_tokens = 4 }\n")
    with pytest.raises(klgen.SpecError) as e:
        klgen.spec_info(bad)
    assert (e.value.file, e.value.line, e.value.field) == (str(bad), 4, "tp")
    assert str(e.value).startswith(f"{bad}:4: tp: padded vocab 50304")
    # the same message as the command line's
    cli = subprocess.run(["klgen", "--check", str(bad)],
                         capture_output=True, text=True)
    assert cli.returncode == 1 and cli.stderr.strip() == f"klgen: {e.value}"


def test_spec_error_without_field():
    with pytest.raises(klgen.SpecError) as e:
        klgen.spec_info(source="return {")
    assert e.value.file == "<spec string>" and e.value.line == 1 and e.value.field is None
    assert isinstance(e.value, ValueError) and isinstance(e.value, klgen.Error)


def test_hostile_spec_is_bounded(monkeypatch):
    monkeypatch.setenv("KLGEN_SPEC_TIME_MS", "200")
    with pytest.raises(klgen.SpecError, match="ran past its time limit \\(200 ms\\)"):
        klgen.spec_info(source="while true do pcall(function() while true do end end) end")
    with pytest.raises(klgen.SpecError, match="undefined global 'setmetatable'"):
        klgen.spec_info(source="return setmetatable({}, { __index = function() return 1 end })")
    monkeypatch.setenv("KLGEN_SPEC_TIME_MS", "soon")
    with pytest.raises(ValueError, match="KLGEN_SPEC_TIME_MS='soon'"):
        klgen.spec_info(source=GOOD)


def test_lua_release_faults_are_gone():
    # a long field chain's message: a crash of the interpreter (SIGSEGV)
    # before Lua 5.4.8
    chain = "local t = {}\nt.x = t\nreturn t" + ".x" * 100000 + ".nope + 1"
    with pytest.raises(klgen.SpecError, match="attempt to perform arithmetic on a nil value "
                       "\\(field 'nope'\\)") as e:
        klgen.spec_info(source=chain)
    assert e.value.line == 3
    # bitwise operations on constants past the 256th
    consts = "local k = {" + ",".join(f"{i}.5" for i in range(300)) + "}\n"
    info = klgen.spec_info(source=consts + "return { name = 'm', vocab_size = 1000 | (2 or 3), "
                           "tp = 1, dtype = 'bf16', max_tokens = 1 }")
    assert info.vocab_size == 1002


HOSTILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "spec", "hostile")


def _hostile_specs(tmp_path):
    """tests/spec/hostile (see test_spec.c) and a long field chain: (path, what the
    message says)."""
    cases = []
    for f in sorted(os.listdir(HOSTILE)):
        if f.endswith(".lua"):
            path = os.path.join(HOSTILE, f)
            with open(path) as fh:
                first = fh.readline()
            assert first.startswith("-- refused: "), path
            cases.append((path, first[len("-- refused: "):].strip()))
    chain = tmp_path / "chain.lua"
    chain.write_text("local t = {}\nt.x = t\nreturn t" + ".x" * 100000 + ".nope + 1\n")
    cases.append((str(chain), "attempt to perform arithmetic on a nil value (field 'nope')"))
    assert len(cases) > 1
    return cases


@pytest.mark.parametrize("loader", ["spec_info", "generate"])
def test_hostile_specs_are_refused_in_time(tmp_path, monkeypatch, loader):
    # each within 1.5 times its limit, as every loader promises
    monkeypatch.setenv("KLGEN_SPEC_TIME_MS", "500")
    out = tmp_path / "out"
    for path, want in _hostile_specs(tmp_path):
        t0 = time.monotonic()
        with pytest.raises(klgen.SpecError) as e:
            if loader == "spec_info":
                klgen.spec_info(path)
            else:
                klgen.generate(path, out)
        dt = time.monotonic() - t0
        assert want in str(e.value) and e.value.file == path, str(e.value)
        assert dt < 0.75, f"{path}: {dt:.3f} s under a 500 ms limit"
        assert not out.exists()


def test_generate_and_spec_info_share_the_time_limit(tmp_path, monkeypatch):
    loop = tmp_path / "loop.lua"
    loop.write_text("while true do end")
    monkeypatch.setenv("KLGEN_SPEC_TIME_MS", "200")
    for call in (klgen.spec_info, lambda p: klgen.generate(p, tmp_path / "o")):
        with pytest.raises(klgen.SpecError, match="ran past its time limit \\(200 ms\\)"):
            call(str(loop))
    monkeypatch.setenv("KLGEN_SPEC_TIME_MS", "soon")
    said = []
    for call in (klgen.spec_info, lambda p: klgen.generate(p, tmp_path / "o")):
        with pytest.raises(ValueError) as e:
            call(KIMI)
        said.append(str(e.value))
    assert said == ["environment: KLGEN_SPEC_TIME_MS='soon': expected an integer in 1..3600000"] * 2
    assert not (tmp_path / "o").exists()


def test_messages_escape_control_bytes():
    with pytest.raises(ValueError) as e:
        klgen.spec_info(klgen.spec_path("deepseek_v3"), name="zzz\x1b[31m\n")
    assert str(e.value) == ("no spec named 'zzz\\x1b[31m\\x0a' in it; it defines deepseek_v3_tp2, "
                            "deepseek_v3_tp4, deepseek_v3_tp8")


def test_arguments():
    with pytest.raises(TypeError, match="exactly one"):
        klgen.spec_info()
    with pytest.raises(TypeError, match="exactly one"):
        klgen.spec_info(KIMI, source=GOOD)
    with pytest.raises(TypeError, match="source must be a str"):
        klgen.spec_info(source=b"return {}")
    with pytest.raises(TypeError, match="name must be a str"):
        klgen.spec_info(KIMI, 3)
    with pytest.raises(FileNotFoundError):
        klgen.spec_info("/nonexistent/spec.lua")
    with pytest.raises(FileNotFoundError, match="shipped: .*kimi_k3_tp8.*their specs: .*deepseek_v3_tp4"):
        klgen.spec_path("no_such_model")


def test_generate_picks_one_spec(tmp_path):
    ds = klgen.spec_path("deepseek_v3")
    assert klgen.generate("deepseek_v3_tp4", tmp_path / "a") == [
        str(tmp_path / "a" / "deepseek_v3_tp4.cu"), str(tmp_path / "a" / "deepseek_v3_tp4.h")]
    assert sorted(os.listdir(tmp_path / "a")) == ["deepseek_v3_tp4.cu", "deepseek_v3_tp4.h"]
    assert klgen.generate(ds, tmp_path / "b", name="deepseek_v3_tp8") == [
        str(tmp_path / "b" / "deepseek_v3_tp8.cu"), str(tmp_path / "b" / "deepseek_v3_tp8.h")]
    with pytest.raises(klgen.Error, match="it defines deepseek_v3_tp2, deepseek_v3_tp4"):
        klgen.generate(ds, tmp_path / "c", name="nope")
    assert not (tmp_path / "c").exists()


def test_generate_matches_the_command_line(tmp_path):
    written = klgen.generate(KIMI, tmp_path / "py")
    assert written == [str(tmp_path / "py" / "kimi_k3_tp8.cu"), str(tmp_path / "py" / "kimi_k3_tp8.h")]
    subprocess.run(["klgen", "-q", "-o", str(tmp_path / "cli"), KIMI], check=True)
    for name in ("kimi_k3_tp8.cu", "kimi_k3_tp8.h"):
        assert (tmp_path / "py" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes()


def test_generate_errors_replace_nothing(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "bad.cu").write_text("old")
    bad = tmp_path / "bad.lua"
    bad.write_text("return { name = 'bad', vocab_size = 8, tp = 3, dtype = 'bf16', max_tokens = 1 }")
    with pytest.raises(klgen.SpecError) as e:
        klgen.generate(bad, out)
    assert e.value.field == "tp" and e.value.line == 1
    assert (out / "bad.cu").read_text() == "old" and sorted(os.listdir(out)) == ["bad.cu"]


def test_console_script():
    done = subprocess.run(["klgen", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "klgen 0.1.0"


def test_nul_bytes_and_surrogates_are_refused(tmp_path):
    # C reads a string up to its first NUL: what follows would never be seen
    with pytest.raises(klgen.SpecError, match="NUL byte at offset 50"):
        klgen.spec_info(source=GOOD[:50] + '\0 error("x")')
    with pytest.raises(ValueError, match="NUL"):
        klgen.spec_info(klgen.spec_path("deepseek_v3"), name="deepseek_v3_tp2\0zzz")
    with pytest.raises(ValueError, match="NUL"):
        klgen.spec_info(KIMI + "\0")
    with pytest.raises(ValueError, match="NUL"):
        klgen.generate(KIMI, str(tmp_path) + "\0x")
    # a lone surrogate is no text C can be given
    with pytest.raises(klgen.SpecError, match="UTF-8"):
        klgen.spec_info(source="return { name = '\ud800' }")
    with pytest.raises(ValueError, match="UTF-8"):
        klgen.spec_info(KIMI, name="\udcff")


def test_spec_names_is_one_evaluation():
    # the count depends on a table's address: it differs from run to run, and
    # the names must come from the same run as the count
    src = ("local n = 5 + tostring({}):byte(-3) % 3 local t = {} "
           "for i = 1, n do t[i] = { name = 'm' .. i, vocab_size = 64, tp = 1, "
           "dtype = 'bf16', max_tokens = 1 } end return t")
    for _ in range(40):
        names = klgen.spec_names(source=src)
        assert 5 <= len(names) <= 7 and names == [f"m{i}" for i in range(1, len(names) + 1)]
    many = ("local t = {} for i = 1, 256 do t[i] = { name = 'm' .. i, vocab_size = 64, tp = 1, "
            "dtype = 'bf16', max_tokens = 1 } end return t")
    assert klgen.spec_names(source=many)[-1] == "m256"


def test_fields_become_exactly_the_spec():
    # what the caller passes is what the spec says, byte for byte
    for value in ('a"b\\c\nd', "caf\u00e9 \u20ac", "x\x1b[2J", "--]] ]==] '"):
        src = klgen._fields_source({"vocab_size": 64, "tp": 1, "dtype": value, "max_tokens": 1})
        with pytest.raises(klgen.SpecError) as e:
            klgen.spec_info(source=src)
        assert e.value.field == "dtype"
        shown = "".join(c if c.isprintable() and ord(c) < 0x80 or ord(c) >= 0xa0 else
                        "".join(f"\\x{b:02x}" for b in c.encode()) for c in value)
        assert f"'{shown}' is not one of bf16" in str(e.value), (value, str(e.value))
    info = klgen.spec_info(source=klgen._fields_source(
        {"name": "m", "vocab_size": 2 ** 17, "tp": 2, "dtype": "fp16", "max_tokens": 1.0,
         "softcap": 1e-5, "scale": -0.1}))
    assert (info.name, info.vocab_size, info.max_tokens) == ("m", 131072, 1)
    # refused before any Lua is written, naming the field
    for key, value in (("softcap", float("nan")), ("scale", float("inf")),
                       ("softcap", float("-inf")), ("name", "a\0b"), ("name", "\ud800"),
                       ("vocab_size", 2 ** 64)):
        with pytest.raises(klgen.SpecError) as e:
            klgen._fields_source({key: value})
        assert e.value.field == key, (key, value)
    with pytest.raises(TypeError, match="got bool"):
        klgen._fields_source({"tp": True})
    with pytest.raises(TypeError, match="unknown spec field"):
        klgen._fields_source({"softcapp": 30.0})


def test_undefined_globals_and_empty_values_are_errors():
    base = "return { name = 'g', vocab_size = 256, tp = 1, dtype = 'bf16', max_tokens = 1, "
    with pytest.raises(klgen.SpecError, match="undefined global 'nan'"):
        klgen.spec_info(source=base + "softcap = nan }")
    for bad in ("out_dtype = ''", "numerics = ''", "['softcap\\0'] = 3"):
        with pytest.raises(klgen.SpecError):
            klgen.spec_info(source=base + bad + " }")


def test_generate_takes_paths_as_paths(tmp_path, monkeypatch):
    # a spec file whose name looks like an option is still a file
    (tmp_path / "--help").write_bytes(open(KIMI, "rb").read())
    monkeypatch.chdir(tmp_path)
    written = klgen.generate("--help", "out")
    assert written == [os.path.join("out", "kimi_k3_tp8.cu"), os.path.join("out", "kimi_k3_tp8.h")]
    assert all(os.path.getsize(p) > 0 for p in written)


def test_generate_reports_what_it_wrote(tmp_path):
    # the files are those of the run that wrote them, not of another evaluation
    spec = tmp_path / "varies.lua"
    spec.write_text("local n = 1 + tostring({}):byte(-3) % 4 local t = {} for i = 1, n do "
                    "t[i] = { name = 'v' .. i, vocab_size = 64, tp = 1, dtype = 'bf16', "
                    "max_tokens = 1 } end return t")
    for k in range(6):
        out = tmp_path / f"out{k}"
        written = klgen.generate(spec, out)
        assert sorted(written) == sorted(str(out / f) for f in os.listdir(out)), k


def test_generate_keeps_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        written = klgen.generate(KIMI, tmp_path / "private")
    finally:
        os.umask(old)
    assert {oct(os.stat(p).st_mode & 0o777) for p in written} == {"0o600"}


def test_hostile_specs_stop_at_their_limit(monkeypatch):
    # C work that no instruction count sees: one sort of 1 MiB strings would
    # run for minutes; parsing a page of gotos takes ~1 s here
    monkeypatch.setenv("KLGEN_SPEC_TIME_MS", "300")
    gotos = "".join(f"goto l{i}\n" for i in range(30000)) + \
        "".join(f"::l{i}:: do end\n" for i in range(30000)) + GOOD
    for src in ("local s = ('x'):rep(1 << 20) local t = {} for i = 1, 1e5 do t[i] = s end "
                "table.sort(t)",
                "local a, b = ('\\0'):rep(1 << 20), ('\\0'):rep(1 << 20) "
                "while true do local _ = a < b end",
                gotos):
        t0 = time.monotonic()
        with pytest.raises(klgen.SpecError, match=r"ran past its time limit \(300 ms\)"):
            klgen.spec_names(source=src)
        assert time.monotonic() - t0 < 0.3 + 2.0


def test_a_dead_group_raises_device_error():
    # KLRT_EDEVICE, what a one-shot call returns once a rank of the group timed
    # out (and kl_ctx_status), is klgen.DeviceError in Python (the engines'
    # drop-ins let it propagate)
    from klgen import _capi
    with pytest.raises(klgen.DeviceError):
        _capi.check(_capi.EDEVICE)
    assert issubclass(klgen.DeviceError, klgen.Error)


def test_unknown_field_is_named():
    for extra, field in (("frob = 1", "frob"), ("vocab_sise = 1", "vocab_sise")):
        with pytest.raises(klgen.SpecError) as e:
            klgen.spec_info(source="return { name = 'g', vocab_size = 256, tp = 1, "
                                   f"dtype = 'bf16', max_tokens = 1, {extra} }}")
        assert e.value.field == field and f": {field}: unknown field" in str(e.value)


def test_shipped_specs_by_name(tmp_path, monkeypatch):
    assert "kimi_k3_tp8" in klgen.shipped_specs()
    assert klgen.spec_info("kimi_k3_tp8") == klgen.spec_info(KIMI)
    assert klgen.spec_names("deepseek_v3") == klgen.spec_names(klgen.spec_path("deepseek_v3"))
    assert klgen.generate("gpt2_tp4", tmp_path / "out") == [
        str(tmp_path / "out" / "gpt2_tp4.cu"), str(tmp_path / "out" / "gpt2_tp4.h")]
    with pytest.raises(FileNotFoundError) as e:
        klgen.spec_info("no_such_spec")
    assert str(e.value).startswith("no_such_spec: no such file, and no shipped spec file or spec "
                                   "of that name (shipped: deepseek_v3, ") and "\n" not in str(e.value)
    # a file of that name wins
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kimi_k3_tp8").write_text(GOOD)
    assert klgen.spec_info("kimi_k3_tp8").name == "m"


def _has_torch():
    try:
        import torch  # noqa: F401
        return True
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(_has_torch(), reason="torch is installed")
def test_without_torch_the_torch_parts_say_how_to_get_it():
    for name in ("LogitsGather", "TopK"):
        with pytest.raises(ImportError, match=r"^klgen\.%s needs PyTorch: pip install 'klgen\[torch\]'$"
                           % name):
            getattr(klgen, name)
    for module in ("klgen.bench", "klgen.reference"):
        with pytest.raises(ImportError, match=r"^%s needs PyTorch: pip install 'klgen\[torch\]'$"
                           % module.replace(".", r"\.")):
            importlib.import_module(module)
    done = subprocess.run([sys.executable, "-m", "klgen.bench", "--help"], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    assert done.stderr == "python -m klgen.bench needs PyTorch: pip install 'klgen[torch]'\n"


# A stand-in for torch on a machine with no GPU driver: what klgen's PyTorch
# part touches before it asks torch for a GPU, and a CUDA that is unavailable.
_NO_DRIVER_TORCH = '''
import types
class dtype: pass
class Tensor: pass
bfloat16, float16, float32, int32, int64 = dtype(), dtype(), dtype(), dtype(), dtype()
_C = types.SimpleNamespace()
class _Op:
    def __init__(self, fn): self.fn = fn
    def register_fake(self, fn): return fn
library = types.SimpleNamespace(custom_op=lambda name, mutates_args: _Op)
def _no_driver(*a):
    raise RuntimeError("Found no NVIDIA driver on your system.")
cuda = types.SimpleNamespace(is_available=lambda: False, current_device=_no_driver)
'''


def test_without_a_driver_logits_gather_says_so(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(_NO_DRIVER_TORCH)
    (tmp_path / "torch" / "distributed.py").write_text(
        "is_available = lambda: True\nis_initialized = lambda: True\n")
    code = ("import klgen\ntry:\n    klgen.LogitsGather('kimi_k3_tp8')\n"
            "except klgen.DeviceError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path)), stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("LogitsGather needs a CUDA GPU and its driver: torch finds none "
                           "(torch.cuda.is_available() is False)\n")


def test_the_package_is_python_3_9():
    # the wheel installs on Python >= 3.9: no syntax of a later Python
    import ast
    pkg = os.path.dirname(klgen.__file__)
    for root, _, files in os.walk(pkg):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                with open(path, encoding="utf-8") as src:
                    ast.parse(src.read(), path, feature_version=(3, 9))


def test_engine_plugins(monkeypatch):
    # the installed wheel declares both entry points; unasked they import
    # nothing (here there is no vLLM or SGLang to import); a value they cannot
    # read is an error that names the variable
    import sys
    from importlib.metadata import entry_points

    from klgen import integrations
    for group, name in (("vllm.general_plugins", "vllm_plugin"),
                        ("sglang.srt.plugins", "sglang_plugin")):
        (ep,) = [ep for ep in entry_points(group=group) if ep.name == "klgen"]
        assert ep.value == f"klgen.integrations:{name}"
    for variable, plugin in (("KLGEN_VLLM", integrations.vllm_plugin),
                             ("KLGEN_SGLANG", integrations.sglang_plugin)):
        for off in (None, "", "0"):
            if off is None:
                monkeypatch.delenv(variable, raising=False)
            else:
                monkeypatch.setenv(variable, off)
            plugin()
        monkeypatch.setenv(variable, "yes")
        with pytest.raises(ValueError, match=f"{variable}='yes'"):
            plugin()
    assert "klgen.integrations.vllm" not in sys.modules
    assert "klgen.integrations.sglang" not in sys.modules


# ---- _capi's structs against klrt.h ----

_C_SIZES = {"size_t": 8, "int64_t": 8, "uint64_t": 8, "long long": 8, "int": 4, "int32_t": 4,
            "float": 4, "char": 1, "kl_nccl_comm": 8, "kl_allgather_fn": 8}


def _header_fields(header, struct):
    """(name, bytes) of each field of `typedef struct struct {...} struct;` in
    klrt.h, in order: comments dropped, a pointer 8 bytes, arrays counted."""
    import re

    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (struct, struct), header, re.S)
    assert body, f"{struct} not found in klrt.h"
    text = re.sub(r"/\*.*?\*/", "", body.group(1), flags=re.S)
    consts = dict(re.findall(r"#define (\w+) (\d+)", header))
    fields = []
    for decl in filter(None, (d.strip() for d in text.split(";"))):
        base = re.match(r"(?:const )?((?:unsigned )?(?:long long|\w+))\s*(.*)", decl, re.S)
        for item in base.group(2).split(","):
            item = item.strip()
            pointer, name = item.startswith("*"), item.lstrip("*").strip()
            count = 1
            array = re.match(r"(\w+)\[(\w+)\]", name)
            if array:
                name, n = array.groups()
                count = int(consts.get(n, n)) if not n.endswith("_COUNT") else \
                    _enum_index(header, n)
            size = 8 if pointer else _C_SIZES[base.group(1).replace("unsigned ", "")]
            fields.append((name, size * count))
    return fields


def _enum_index(header, name):
    """The value of enumerator `name` in klrt.h (its place in its enum)."""
    import re

    for body in re.findall(r"enum \w* ?\{(.*?)\}", header, re.S):
        names = [re.match(r"\s*(\w+)", e).group(1)
                 for e in re.sub(r"/\*.*?\*/", "", body, flags=re.S).split(",") if e.strip()]
        if name in names:
            return names.index(name)
    raise AssertionError(f"{name} not found in klrt.h")


@pytest.mark.parametrize("struct, cls", [("kl_config", "Config"), ("kl_sampling", "Sampling"),
                                         ("kl_stats", "Stats"), ("kl_info", "Info")])
def test_capi_structs_are_klrt_h(struct, cls):
    """Each ctypes mirror has klrt.h's fields, in its order, of its sizes: a
    field added to one and not the other would shift every field after it."""
    import ctypes

    from klgen import _capi

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "runtime",
                        "include", "klrt", "klrt.h")
    if not os.path.exists(path):
        pytest.skip("not run from the source tree")
    with open(path) as f:
        want = _header_fields(f.read(), struct)
    mirror = getattr(_capi, cls)
    got = [(name, ctypes.sizeof(t)) for name, t in mirror._fields_]
    assert got == want
