"""``Kernel``: a compiled PrimFunc you call on torch tensors, with its CUDA source, SASS and resource usage.

Calls are checked in Python before the launch, each failure an ``ArgumentError`` naming what was expected: argument
count, torch tensor, dtype, shape (symbolic dims bound consistently across arguments), contiguity, 16-byte alignment of
the data pointer, one device for all tensors, a CUDA device the cubin can run on. The checks are precomputed per
parameter at construction so a call costs a few attribute reads per tensor.

``MMAEMIT_INTERPRET=1`` routes calls to ``mmaemit.interpret.interpret(kernel, *tensors)`` instead (every parameter
in PrimFunc order, outputs already allocated), which also accepts CPU tensors.
"""
from __future__ import annotations

import os

import torch

from .. import dtypes as _dt
from ..arch import Arch, as_arch
from ..errors import ArgumentError, UnsupportedConfigError, choices
from . import sass as _sass
from .gating import check_instructions
from .toolchain import compile_cubin, sass_of_cubin

__all__ = ["Kernel"]

#: data pointers must be 16-byte aligned: kernels use 16-byte vector loads / cp.async on them
ALIGNMENT_BYTES = 16

_EXTRA_TORCH = {"bool": "bool", "int16": "int16", "int64": "int64", "uint16": "uint16", "uint64": "uint64"}


def _torch_dtype(tvm_dtype: str):
    try:
        return _dt.torch_dtype(tvm_dtype)
    except UnsupportedConfigError:
        name = _EXTRA_TORCH.get(tvm_dtype)
        return getattr(torch, name) if name else None


class _Slots:
    """Numbers the distinct symbolic variables (by identity; TVM may give two variables the same name)."""

    def __init__(self):
        self.vars: list = []

    def slot(self, var) -> int:
        for i, v in enumerate(self.vars):
            if v.same_as(var):
                return i
        self.vars.append(var)
        return len(self.vars) - 1


_BINOPS = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "FloorDiv": lambda a, b: a // b, "FloorMod": lambda a, b: a % b,
    "Min": min, "Max": max,
}


def _compile_expr(expr, slots: _Slots):
    """A Python function env -> int for an integer PrimExpr, its free variable slots; None if unsupported."""
    kind = type(expr).__name__
    if kind == "IntImm":
        value = int(expr.value)
        return (lambda env: value), set()
    if kind in ("Var", "SizeVar"):
        i = slots.slot(expr)
        return (lambda env: env[i]), {i}
    if kind in _BINOPS:
        a, b = _compile_expr(expr.a, slots), _compile_expr(expr.b, slots)
        if a is None or b is None:
            return None
        op, fa, fb = _BINOPS[kind], a[0], b[0]
        return (lambda env: op(fa(env), fb(env))), a[1] | b[1]
    return None


class _BufferParam:
    __slots__ = ("index", "name", "dtype", "torch_dtype", "ndim", "dims", "strides", "shape_text", "strides_text",
                 "var_names", "const_shape")

    def __init__(self, index, param, slots: _Slots):
        self.index, self.name, self.dtype = index, param.name, str(param.dtype)
        self.torch_dtype = _torch_dtype(self.dtype)
        shape = list(param.shape)
        self.ndim = len(shape)
        self.dims = [self._dim(e, slots) for e in shape]
        static = all(d[0] == "const" for d in self.dims)
        self.const_shape = torch.Size([d[1] for d in self.dims]) if static else None
        strides = list(param.strides)
        self.strides = [self._dim(e, slots) for e in strides] if strides else None
        self.shape_text = self._tuple_text(shape)
        self.strides_text = self._tuple_text(strides) if strides else "(compact)"
        self.var_names = {}
        for kind, what, text in self.dims + (self.strides or []):
            if kind == "var":
                self.var_names[what] = text
        for i, v in enumerate(slots.vars):
            self.var_names.setdefault(i, v.name or f"<symbolic {i}>")

    @staticmethod
    def _tuple_text(exprs) -> str:
        return "(" + ", ".join(str(e) for e in exprs) + ("," if len(exprs) == 1 else "") + ")"

    def text(self, what: str) -> str:
        return self.shape_text if what == "shape" else self.strides_text

    @staticmethod
    def _dim(expr, slots):
        kind = type(expr).__name__
        if kind == "IntImm":
            return ("const", int(expr.value), str(expr))
        if kind in ("Var", "SizeVar"):
            return ("var", slots.slot(expr), str(expr))
        compiled = _compile_expr(expr, slots)
        if compiled is None:
            return ("skip", None, str(expr))  # left to TVM's own host-side check
        return ("expr", compiled, str(expr))


class _ScalarParam:
    __slots__ = ("index", "name", "dtype", "slot")

    def __init__(self, index, param, slots: _Slots):
        self.index, self.name, self.dtype = index, param.name, str(param.ty.dtype)
        self.slot = slots.slot(param)


def _is_buffer_param(param) -> bool:
    return type(param.ty).__name__ == "BufferType"


def _interpret_enabled() -> bool:
    return os.environ.get("MMAEMIT_INTERPRET", "") not in ("", "0")


class KernelSignature:
    """The parameters of a PrimFunc as precomputed checks, split into inputs and ``out_idx`` outputs."""

    def __init__(self, prim_func, name: str, out_idx=None):
        self.name = name
        self.slots = _Slots()
        self.params = [(_BufferParam if _is_buffer_param(p) else _ScalarParam)(i, p, self.slots)
                       for i, p in enumerate(prim_func.params)]
        self.out_idx = self._normalize_out_idx(out_idx)
        outs = set(self.out_idx)
        self.inputs = [p for p in self.params if p.index not in outs]
        self.outputs = [self.params[i] for i in self.out_idx]
        self._check_outputs_resolvable()

    def _normalize_out_idx(self, out_idx) -> tuple:
        if out_idx is None:
            return ()
        items = [out_idx] if isinstance(out_idx, int) else list(out_idx)
        n = len(self.params)
        result = []
        for i in items:
            if not isinstance(i, int) or isinstance(i, bool) or not -n <= i < n:
                raise ArgumentError(f"out_idx {i!r} is not a parameter index of {self.name} ({n} parameters: "
                                    f"valid indices {-n}..{n - 1})")
            j = i % n
            if not isinstance(self.params[j], _BufferParam):
                raise ArgumentError(f"out_idx {i} names scalar parameter {self.params[j].name!r}; outputs must be "
                                    f"buffers: choose from {choices(p.index for p in self.params if isinstance(p, _BufferParam))}")
            if j in result:
                raise ArgumentError(f"out_idx names parameter {self.params[j].name!r} twice")
            result.append(j)
        return tuple(result)

    def _check_outputs_resolvable(self):
        bound = set()
        for p in self.inputs:
            if isinstance(p, _ScalarParam):
                bound.add(p.slot)
            else:
                bound.update(d[1] for d in p.dims if d[0] == "var")
        for p in self.outputs:
            if p.torch_dtype is None:
                raise ArgumentError(f"output {p.name!r} has dtype {p.dtype}, which no torch dtype holds; "
                                    f"pass it as an input instead (drop it from out_idx)")
            for kind, what, text in p.dims:
                if (kind == "var" and what not in bound) or (kind == "expr" and not what[1] <= bound) or kind == "skip":
                    raise ArgumentError(f"cannot allocate output {p.name!r}: its dim {text} is not fixed by the "
                                        f"inputs' shapes; pass it as an input instead (drop it from out_idx)")


class Kernel:
    """A PrimFunc compiled for one arch (made by ``mmaemit.compile``).

    ``kernel(*tensors)`` checks and launches it on torch's current stream. With ``out_idx`` the call takes only the
    inputs, allocates the outputs (``torch.empty`` on the inputs' device) and returns them (one tensor or a tuple).
    """

    def __init__(self, prim_func, arch, target, executable, name: str, out_idx=None, instructions=(),
                 signature: "KernelSignature | None" = None):
        self.prim_func = prim_func
        self.arch: Arch = as_arch(arch)
        self.target = target
        self.executable = executable
        self.name = name
        self.ptx_instructions = tuple(instructions)
        device_mods = [m for m in executable.mod.imports if m.kind == "cuda"]
        self.cuda_source: str = device_mods[0].inspect_source() if device_mods else ""
        self._fn = None
        self._device_ok: dict = {}
        sig = signature if signature is not None else KernelSignature(prim_func, name, out_idx)
        self._params, self._slots, self.out_idx = sig.params, sig.slots, sig.out_idx
        self._inputs, self._outputs = sig.inputs, sig.outputs
        self._float_scalars = [p for p in self._inputs if isinstance(p, _ScalarParam) and
                               p.dtype.startswith(("float", "bfloat"))]

    # ---------------------------------------------------------------- signature
    @property
    def param_names(self) -> tuple:
        return tuple(p.name for p in self._params)

    def signature(self) -> str:
        def one(p):
            if isinstance(p, _BufferParam):
                return f"{p.name}: {p.dtype}{p.shape_text}"
            return f"{p.name}: {p.dtype}"

        ins = ", ".join(one(p) for p in self._inputs)
        outs = ", ".join(one(p) for p in self._outputs)
        return f"{self.name}({ins})" + (f" -> ({outs})" if outs else "")

    def __repr__(self) -> str:
        return f"<mmaemit.Kernel {self.signature()} for {self.arch.name}>"

    # ---------------------------------------------------------------- calling
    def __call__(self, *args):
        interpret = _interpret_enabled()
        full, outputs = self._check_and_allocate(args, interpret)
        if interpret:
            try:
                from ..interpret import interpret as run_interpreter
            except ImportError as e:
                raise ImportError(f"MMAEMIT_INTERPRET is set but mmaemit.interpret cannot be imported ({e}); "
                                  f"unset MMAEMIT_INTERPRET to launch on the GPU") from e
            run_interpreter(self, *full)
        else:
            fn = self._fn
            if fn is None:
                fn = self._fn = self.executable[self.name]
            fn(*full)
        if not outputs:
            return None
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _check_and_allocate(self, args, interpret: bool):
        inputs = self._inputs
        if len(args) != len(inputs):
            raise ArgumentError(f"{self.name} takes {len(inputs)} argument(s) {self.signature()}, got {len(args)}")
        env = [None] * len(self._slots.vars)
        where = [None] * len(self._slots.vars)
        tensors = []
        for p, a in zip(inputs, args):
            if isinstance(p, _ScalarParam):
                self._check_scalar(p, a, env, where)
                continue
            if not isinstance(a, torch.Tensor):
                raise ArgumentError(f"argument {p.name!r} must be a torch.Tensor of {p.dtype}{p.shape_text}, "
                                    f"got {type(a).__name__}")
            if a.dtype != p.torch_dtype:
                want = p.torch_dtype if p.torch_dtype is not None else f"{p.dtype} (no torch equivalent)"
                raise ArgumentError(f"argument {p.name!r} must have dtype {want}, got {a.dtype}")
            if p.const_shape is None or a.shape != p.const_shape:  # fast path: a fully static shape that matches
                self._check_dims(p, a.shape, "shape", env, where)
            # contiguous even where the buffer declares strides: tvm 0.27's tirx codegen indexes parameters as compact
            # arrays whatever strides they declare, so a strided view would be read wrongly
            if not a.is_contiguous():
                raise ArgumentError(f"argument {p.name!r} must be contiguous (row-major), got strides "
                                    f"{tuple(a.stride())}; pass .contiguous()")
            if p.strides is not None:
                self._check_dims(p, a.stride(), "strides", env, where)
            if a.data_ptr() % ALIGNMENT_BYTES:
                raise ArgumentError(f"argument {p.name!r}: data pointer must be {ALIGNMENT_BYTES}-byte aligned, "
                                    f"got address % {ALIGNMENT_BYTES} = {a.data_ptr() % ALIGNMENT_BYTES} "
                                    f"(storage_offset {a.storage_offset()} elements); pass a fresh tensor (.clone())")
            tensors.append((p, a))
        for p, a in tensors:  # composite dims need every variable bound first
            self._check_exprs(p, a.shape, "shape", env, where)
            if p.strides is not None:
                self._check_exprs(p, a.stride(), "strides", env, where)

        device = self._check_device(tensors, interpret)
        outputs = [torch.empty([self._dim_value(d, env) for d in p.dims], dtype=p.torch_dtype, device=device)
                   for p in self._outputs]
        if not self._outputs and not self._float_scalars:
            return args, outputs
        full = [None] * len(self._params)
        for p, a in zip(inputs, args):
            full[p.index] = a
        for p in self._float_scalars:
            full[p.index] = float(full[p.index])  # the packed-func ABI wants a float for a float parameter
        for p, t in zip(self._outputs, outputs):
            full[p.index] = t
        return full, outputs

    @staticmethod
    def _dim_value(dim, env):
        kind, what, _ = dim
        if kind == "const":
            return what
        if kind == "var":
            return env[what]
        return what[0](env)

    @staticmethod
    def _check_scalar(p, a, env, where):
        is_int = p.dtype.startswith(("int", "uint"))
        if p.dtype == "bool":
            ok = isinstance(a, bool)
        elif is_int:
            ok = isinstance(a, int) and not isinstance(a, bool)
        else:
            ok = isinstance(a, (int, float)) and not isinstance(a, bool)
        if not ok:
            raise ArgumentError(f"argument {p.name!r} must be a Python {'int' if is_int else 'number'} "
                                f"({p.dtype}), got {type(a).__name__}")
        if env[p.slot] is not None and env[p.slot] != a:
            raise ArgumentError(f"argument {p.name!r} = {a} but {where[p.slot]} fixed it to {env[p.slot]}")
        env[p.slot], where[p.slot] = a, f"argument {p.name!r}"

    @staticmethod
    def _check_dims(p, actual, what, env, where):
        if len(actual) != p.ndim:
            raise ArgumentError(f"argument {p.name!r} must be {p.ndim}-D with shape {p.shape_text}, got "
                                f"{len(actual)}-D {what} {tuple(actual)}")
        for axis, ((kind, val, text), got) in enumerate(zip(p.strides if what == "strides" else p.dims, actual)):
            if kind == "const":
                if got != val:
                    raise ArgumentError(f"argument {p.name!r} must have {what} {p.text(what)}, got {tuple(actual)} "
                                        f"({what}[{axis}] must be {val})")
            elif kind == "var":
                if env[val] is None:
                    env[val], where[val] = got, f"{p.name}.{what}[{axis}]"
                elif env[val] != got:
                    raise ArgumentError(f"argument {p.name!r} must have {what} {p.text(what)} with {text} = "
                                        f"{env[val]} (bound by {where[val]}), got {tuple(actual)}")

    @staticmethod
    def _check_exprs(p, actual, what, env, where):
        for axis, ((kind, val, text), got) in enumerate(zip(p.strides if what == "strides" else p.dims, actual)):
            if kind == "expr":
                fn, free = val
                if any(env[i] is None for i in free):
                    continue  # a variable no argument fixes: TVM's host check decides
                want = fn(env)
                if got != want:
                    bound = ", ".join(f"{self_var} bound by {where[i]}" for i, self_var in
                                      ((i, p.var_names.get(i, "?")) for i in sorted(free)))
                    raise ArgumentError(f"argument {p.name!r} must have {what} {p.text(what)}: {what}[{axis}] = "
                                        f"{text} = {want} ({bound}), got {tuple(actual)}")

    def _check_device(self, tensors, interpret: bool):
        device = None
        for p, a in tensors:
            if device is None:
                device, first = a.device, p.name
            elif a.device != device:
                raise ArgumentError(f"all tensors must be on one device: {first!r} is on {device}, "
                                    f"{p.name!r} is on {a.device}")
        if interpret:
            return device if device is not None else torch.device("cpu")
        if device is None or device.type != "cuda":
            if not torch.cuda.is_available():
                raise ArgumentError(f"no CUDA GPU is visible, so {self.name} cannot launch; run it under "
                                    f"MMAEMIT_INTERPRET=1 (CPU interpreter) or on a machine with a GPU")
            if device is None:
                return torch.device("cuda", torch.cuda.current_device())
            raise ArgumentError(f"argument {first!r} is on {device}; {self.name} runs on CUDA tensors (move them "
                                f"with .cuda(), or set MMAEMIT_INTERPRET=1 to run the CPU interpreter)")
        self._check_device_arch(device)
        return device

    def _check_device_arch(self, device):
        index = device.index if device.index is not None else torch.cuda.current_device()
        ok = self._device_ok.get(index)
        if ok is None:
            major, minor = torch.cuda.get_device_capability(index)
            number, k = major * 10 + minor, self.arch.number
            # a cubin runs on its own major version at an equal or higher minor; "a" cubins only on their exact chip
            ok = (number == k) if self.arch.suffix else (number // 10 == k // 10 and number >= k)
            if not ok:
                ok = f"sm_{number}"
            self._device_ok[index] = ok
        if ok is not True:
            raise ArgumentError(f"{self.name} was compiled for {self.arch.name} but cuda:{index} is an {ok} GPU; "
                                f"compile with target={ok + ('a' if ok in ('sm_90', 'sm_100', 'sm_120') else '')!r} "
                                f"(or target=None for the visible GPU)")

    # ---------------------------------------------------------------- inspection
    def _arch_for_inspection(self, arch) -> Arch:
        a = self.arch if arch is None else as_arch(arch)
        if a != self.arch:
            check_instructions(self.ptx_instructions, a, stacklevel=3)
        return a

    def cubin(self, arch=None):
        """The nvcc-built cubin of ``cuda_source`` for ``arch`` (default: the kernel's), cached."""
        return compile_cubin(self.cuda_source, self._arch_for_inspection(arch))

    def sass(self, arch=None) -> str:
        """``cuobjdump -sass`` of the kernel built for ``arch`` (default: the kernel's arch). Needs no GPU.

        Another arch is first checked against the kernel's PTX instructions (``ArchError`` before nvcc runs).
        """
        return sass_of_cubin(self.cubin(arch))

    def instruction_mix(self, arch=None) -> dict:
        """SASS opcode-base counts: HMMA, IMMA, QMMA, HGMMA, LDSM, STSM, LDGSTS, LDG, STG, LDS, STS, BAR always present,
        plus every other base that occurs. ``@!PT`` padding is not counted."""
        return _sass.instruction_mix(self.sass(arch))

    def opcode_histogram(self, arch=None) -> dict:
        """Counts of full SASS opcodes with modifiers, e.g. ``{"HMMA.16816.F32": 64, "LDSM.16.M88.4": 16, ...}``."""
        return _sass.opcode_histogram(self.sass(arch))

    def resource_usage(self, arch=None, function: str | None = None):
        """``ResourceUsage`` (registers, spills, static smem, stack frame, barriers) from ``ptxas -v``."""
        usage = _sass.parse_ptxas_log(self.cubin(arch).ptxas_log)
        if function is None:
            function = f"{self.name}_kernel" if f"{self.name}_kernel" in usage or len(usage) != 1 else next(iter(usage))
        if function not in usage:
            raise UnsupportedConfigError(f"no kernel {function!r} in the ptxas report; kernels: {choices(usage)}")
        return usage[function]
