"""Launch attributes of a compiled kernel that TVM sets from the device function's launch-parameter tags.

TVM's CUDA runtime launches a kernel with ``cuLaunchKernelEx`` and the programmatic-stream-serialization attribute
(programmatic dependent launch, PDL) when the tag ``tirx.use_programtic_dependent_launch`` (TVM's spelling) is in the
device function's ``tirx.kernel_launch_params``. ``SplitHostDevice`` computes that list (thread axes, dynamic shared
memory); an attribute on the PrimFunc or in its body does not reach it
(``mmaemit.runtime.build.device_launch_params`` shows the list). :func:`programmatic_dependent_launch` marks a
PrimFunc, and :func:`launch_pipeline` (the ``tirx`` pipeline plus one pass, what ``mmaemit.compile`` builds with)
adds the tag to the computed list of a marked kernel's device functions.

With the tag, a kernel may start while the kernel before it in the stream is still running, once every CTA of that
one has executed ``griddepcontrol.launch_dependents`` (or exited). So a marked kernel must execute
``griddepcontrol.wait`` before it reads anything an earlier kernel may have written and before it writes global
memory; until then it may only read what no kernel writes while it runs and issue L2 prefetches (a prefetch never
returns data to a thread, so it cannot observe a write in flight). ``launch_dependents`` early in a kernel lets the
next marked kernel's CTAs take each SM as this one's leave it.
"""
from __future__ import annotations

__all__ = ["PDL_ATTR", "PDL_TAG", "LAUNCH_PARAMS_ATTR", "programmatic_dependent_launch",
           "uses_programmatic_dependent_launch", "launch_pipeline"]

#: PrimFunc attribute that asks for a programmatic dependent launch (read by :func:`launch_pipeline`)
PDL_ATTR = "mmaemit.programmatic_dependent_launch"
#: TVM's launch-parameter tag for it (spelled as TVM spells it)
PDL_TAG = "tirx.use_programtic_dependent_launch"
#: the device function attribute that lists its launch-parameter tags
LAUNCH_PARAMS_ATTR = "tirx.kernel_launch_params"
_DYN_SMEM_TAG = "tirx.use_dyn_shared_memory"    # TVM's runtime wants it last
_PIPELINE = "mmaemit_tirx"


def programmatic_dependent_launch(prim_func):
    """``prim_func`` marked for a programmatic dependent launch (see the module doc for what its body must do)."""
    return prim_func.with_attr(PDL_ATTR, True)


def uses_programmatic_dependent_launch(prim_func) -> bool:
    attrs = prim_func.attrs
    return bool(attrs is not None and PDL_ATTR in attrs and attrs[PDL_ATTR])


def _with_tag(tags):
    tags = [str(t) for t in tags]
    if PDL_TAG in tags:
        return tags
    at = tags.index(_DYN_SMEM_TAG) if _DYN_SMEM_TAG in tags else len(tags)
    return tags[:at] + [PDL_TAG] + tags[at:]


def _tag_pass():
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="mmaemit.TagProgrammaticDependentLaunch")
    def tag(mod, _ctx):
        funcs = dict(mod.functions.items())
        if not any(isinstance(f, tvm.tirx.PrimFunc) and uses_programmatic_dependent_launch(f) for f in funcs.values()):
            return mod
        for gv, f in funcs.items():
            if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and LAUNCH_PARAMS_ATTR in f.attrs:
                funcs[gv] = f.with_attr(LAUNCH_PARAMS_ATTR, _with_tag(f.attrs[LAUNCH_PARAMS_ATTR]))
        return tvm.IRModule(funcs, attrs=mod.attrs, global_infos=mod.global_infos)     # the input stays as it was

    return tag


def launch_pipeline() -> str:
    """Name of the TIR pipeline ``mmaemit.compile`` passes to ``tvm.compile``: TVM's ``tirx`` pipeline, then the
    PDL tag for marked kernels (registered on first use)."""
    import tvm
    from tvm.tirx import compilation_pipeline as cp

    if _PIPELINE not in cp.PIPELINE_MAP:
        def factory(**kwargs):
            lower, finalize_host, finalize_device = tvm.tirx.get_tir_pipeline("tirx", **kwargs)
            return tvm.transform.Sequential([lower, _tag_pass()]), finalize_host, finalize_device

        tvm.tirx.register_tir_pipeline(_PIPELINE, factory)
    return _PIPELINE
