"""Test helper: evaluate the integer PrimExprs that layout maps build on TIR variables (one definition for the tests)."""
import operator

_OPS = {"Add": operator.add, "Sub": operator.sub, "Mul": operator.mul, "FloorDiv": operator.floordiv,
        "FloorMod": operator.mod, "BitwiseXor": operator.xor, "BitwiseAnd": operator.and_,
        "RShift": operator.rshift, "LShift": operator.lshift}


def eval_prim(expr, env):
    """Evaluate a TVM integer PrimExpr built from + - * // % ^ & >> << (any other node fails the test)."""
    import tvm

    if isinstance(expr, int):
        return expr
    if isinstance(expr, tvm.tirx.IntImm):
        return int(expr.value)
    kind = type(expr).__name__
    if kind == "Var":
        return env[expr.name]
    assert kind in _OPS, f"unexpected node {kind} in {expr}"
    return _OPS[kind](eval_prim(expr.a, env), eval_prim(expr.b, env))
