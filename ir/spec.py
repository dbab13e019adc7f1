"""Tuning specs: build them with IREE's Python bindings, link them, and check that they applied.

A spec is a transform-dialect library in the `iree_codegen.tuning_spec_with_default_entrypoint`
format: one exact-shape matcher per problem (`transform.iree.match.contraction` / `convolution` /
`attention` plus `dims_equal` on every dimension class), one `compilation_info` per matched root op,
and a `__kernel_config` entry point whose `foreach_match` tries every matcher. Specs that do not
match compile silently with the default configuration, so `applied_configs` reads back what IREE actually
used.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dispatchtune.candidate import DECOMPOSITION_KEY, configured_compilation_infos
from dispatchtune.errors import DispatchTuneError
from dispatchtune.problem import DIM_CLASSES, Problem
from dispatchtune.targets import Target
from dispatchtune.toolchain import first_error_line, mlir_error_line, run_tool

#: Where GPU attention candidates carry their decomposition_config (see `search.gpu.materialize`).
_SPEC_ATTRS = ("transform.with_named_sequence", "iree_codegen.tuning_spec_with_default_entrypoint")


def matcher_name(problem: Problem) -> str:
    """The spec symbol that matches one problem (stable: derived from the problem key)."""
    return "match_" + re.sub(r"[^A-Za-z0-9_]", "_", problem.key)


def tuning_spec(entries: Sequence[tuple[Problem, str]]) -> str:
    """A tuning spec that gives each problem's root op the paired `compilation_info` (MLIR text).

    Problems must be distinct. An empty `entries` yields a valid spec that changes nothing (used
    for the compiler-default baseline, so every build goes through the same flags).
    """
    from iree.compiler import ir
    from iree.compiler.dialects import transform

    names = [matcher_name(p) for p, _ in entries]
    if len(set(names)) != len(names):
        raise DispatchTuneError("a tuning spec can hold one configuration per problem")
    with ir.Context(), ir.Location.unknown():
        # GPU attention configs carry a decomposition_config, annotated beside compilation_info.
        split = [(p, *_split_decomposition(p, c)) for p, c in entries]
        # Unit-batch convolutions on llvm-cpu are configured after their batch loop is restored
        # (see `_unit_batch_conv_action`), so they leave the top-level match list.
        unit = [(p, c) for p, c, _ in split if _needs_unit_batch_action(p, c)]
        top = [(p, c, d, n) for (p, c, d), n in zip(split, names, strict=True)
               if not _needs_unit_batch_action(p, c)]
        # Attention gets a second matcher for its online form (what the matchers see: llvm-cpu
        # and gfx942 convert attention to online_attention before tuning specs are applied).
        online = [(p, c, d, f"{matcher_name(p)}_online") for p, c, d in split
                  if p.kind == "attention"]
        module = ir.Module.create()
        # The default-entrypoint format demands a `foreach_match`; a spec that configures nothing
        # (the compiler-default baseline) is a plain library whose entry point only yields.
        for attr in _SPEC_ATTRS if entries else _SPEC_ATTRS[:1]:
            module.operation.attributes[attr] = ir.UnitAttr.get()
        any_op = transform.AnyOpType.get()
        any_param = transform.AnyParamType.get()
        readonly = {"transform.readonly": ir.UnitAttr.get()}
        with ir.InsertionPoint(module.body):
            if entries:
                _emit_apply_op_config(any_op, any_param, readonly)
            if any(d for _, _, d in split):
                _emit_apply_op_config(any_op, any_param, readonly, decomposition=True)
            for problem, config, decomposition, name in top:
                _emit_config_matcher(problem, config, decomposition, name, any_op, any_param,
                                     readonly)
            for problem, config in unit:
                name = matcher_name(problem)
                _emit_config_matcher(
                    problem.with_unit_batch(), config, "", name, any_op, any_param, readonly
                )
                batchless = transform.NamedSequenceOp(
                    f"{name}_batchless", [any_op], [any_op], arg_attrs=[readonly]
                )
                with ir.InsertionPoint(batchless.body):
                    _emit_match(problem.without_unit_batch(), batchless.bodyTarget)
                    transform.YieldOp([batchless.bodyTarget])
            if unit:
                text = _unit_batch_conv_action([matcher_name(p) for p, _ in unit])
                for op in ir.Module.parse(text).body.operations:
                    if "sym_visibility" not in op.operation.attributes:  # not a declaration
                        op.operation.clone(ip=ir.InsertionPoint(module.body))
            for problem, config, decomposition, name in online:
                # IREE's online_attention matcher op does not match a masked op (measured on
                # gfx942: such specs never applied), so masked attention is matched as a DAG.
                if decomposition and not problem.mask_map:
                    matcher = transform.NamedSequenceOp(
                        name, [any_op], [any_op, any_param, any_param], arg_attrs=[readonly]
                    )
                    with ir.InsertionPoint(matcher.body):
                        _emit_online_match(problem, matcher.bodyTarget)
                        attrs = [_parse_config(problem, config), ir.Attribute.parse(decomposition)]
                        values = [transform.ParamConstantOp(any_param, a).result for a in attrs]
                        transform.YieldOp([matcher.bodyTarget, *values])
                    continue
                text = _online_attention_matcher(problem, config, name, decomposition)
                parsed = ir.Module.parse(text)
                parsed.body.operations[0].operation.clone(ip=ir.InsertionPoint(module.body))
            matched_by = [(n, d) for _, _, d, n in top] + [(n, d) for _, _, d, n in online]
            names = [n for n, _ in matched_by]
            actions = ["apply_attn_op_config" if d else "apply_op_config" for _, d in matched_by]
            if unit:
                names.append(_DISPATCH_END)
                actions.append(_UNIT_BATCH_ACTION)
            entry = transform.NamedSequenceOp(
                "__kernel_config",
                [any_op],
                [any_op],
                arg_attrs=[{"transform.consumed": ir.UnitAttr.get()}],
            )
            entry.operation.attributes["iree_codegen.tuning_spec_entrypoint"] = ir.UnitAttr.get()
            with ir.InsertionPoint(entry.body):
                if names:
                    matched = transform.ForeachMatchOp(
                        any_op,
                        [],
                        entry.bodyTarget,
                        [],
                        names,
                        actions,
                    )
                    transform.YieldOp([matched.updated])
                else:
                    transform.YieldOp([entry.bodyTarget])
        if not module.operation.verify():  # pragma: no cover - verify raises on failure
            raise DispatchTuneError("built tuning spec failed to verify")
        return str(module)


def _emit_config_matcher(
    problem: Problem, config: str, decomposition: str, name: str, any_op: Any, any_param: Any,
    readonly: dict[str, Any],
) -> None:
    """`@name(op) -> (op, config[, decomposition])`: matches one problem's root op and yields its
    configuration (and its `decomposition_config`, when it has one)."""
    from iree.compiler import ir
    from iree.compiler.dialects import transform

    params = [any_param] * (2 if decomposition else 1)
    matcher = transform.NamedSequenceOp(name, [any_op], [any_op, *params], arg_attrs=[readonly])
    with ir.InsertionPoint(matcher.body):
        _emit_match(problem, matcher.bodyTarget)
        attrs = [_parse_config(problem, config)]
        if decomposition:
            attrs.append(ir.Attribute.parse(decomposition))
        values = [transform.ParamConstantOp(any_param, a).result for a in attrs]
        transform.YieldOp([matcher.bodyTarget, *values])


_DISPATCH_END = "match_dispatch_end"
_UNIT_BATCH_ACTION = "configure_unit_batch_convs"
_INSERT_BATCH_PASS = "iree-codegen-insert-batch-dim-for-batchless-conv"


def _needs_unit_batch_action(problem: Problem, config: str) -> bool:
    """llvm-cpu configurations of unit-batch convolutions (GPU codegen keeps the op as matched)."""
    return problem.unit_batch_conv and "#iree_cpu.lowering_config" in config


def _unit_batch_conv_action(names: Sequence[str]) -> str:
    """The matcher/action pair that configures unit-batch convolutions on llvm-cpu, as MLIR text.

    IREE 3.13 matches specs against the batch-less op (its unit batch loop folded away), then
    llvm-cpu's `iree-codegen-insert-batch-dim-for-batchless-conv` rebuilds the op with a unit batch
    loop and drops the configuration (measured: the default is compiled, silently). The action
    runs that same pass from the spec, so the op is rebuilt first, and then configures the rebuilt
    op (`match_<key>`, 7 loops); IREE's own run of the pass then finds nothing to do. It is
    triggered by the dispatch function's `func.return`, the last op `foreach_match` visits:
    triggered at the convolution itself, the rewrite erases ops the walk visits next (iree-compile
    crashed). `__kernel_config` must hold only the `foreach_match`, hence the pair.
    """
    handle = "!transform.any_op"
    parent = (
        '"transform.get_parent_op"({}) <{{isolated_from_above, nth_parent = 1 : i64}}> : '
        f"({handle}) -> {handle}"
    )
    collect = "\n".join(
        f"    %convs{i} = transform.collect_matching @{name}_batchless in %func : "
        f"({handle}) -> {handle}"
        for i, name in enumerate(names)
    )
    loops = "\n".join(
        f"""    transform.foreach %convs{i} : {handle} {{
    ^bb0(%conv: {handle}):
      %f = {parent.format("%conv")}
      %expanded = transform.apply_registered_pass "{_INSERT_BATCH_PASS}" to %f : ({handle}) -> {handle}
      %done = transform.foreach_match in %expanded @{name} -> @apply_op_config : ({handle}) -> {handle}
    }}"""
        for i, name in enumerate(names)
    )
    # Declarations of the symbols the action refers to, so the text parses on its own.
    declared = "\n".join(
        f"  transform.named_sequence private @{sym}(%op: {handle} {{transform.readonly}}) "
        f"-> ({handle}{results})"
        for name in names
        for sym, results in ((f"{name}_batchless", ""), (name, ", !transform.any_param"))
    )
    declared += (
        f"\n  transform.named_sequence private @apply_op_config(%op: {handle} "
        "{transform.readonly}, %config: !transform.any_param {transform.readonly})"
    )
    return f"""module attributes {{transform.with_named_sequence}} {{
{declared}
  transform.named_sequence @{_DISPATCH_END}(%op: {handle} {{transform.readonly}}) -> ({handle}) {{
    transform.match.operation_name %op ["func.return"] : {handle}
    transform.yield %op : {handle}
  }}
  transform.named_sequence @{_UNIT_BATCH_ACTION}(%end: {handle} {{transform.readonly}}) {{
    %func = {parent.format("%end")}
{collect}
{loops}
    transform.yield
  }}
}}"""


def _emit_apply_op_config(
    any_op: Any, any_param: Any, readonly: dict[str, Any], decomposition: bool = False
) -> None:
    """`@apply_op_config(op, config)`: annotate a matched op with its `compilation_info`;
    `@apply_attn_op_config(op, config, decomposition)` also sets its `decomposition_config`."""
    from iree.compiler import ir
    from iree.compiler.dialects import transform

    params = [any_param] * (2 if decomposition else 1)
    apply = transform.NamedSequenceOp(
        "apply_attn_op_config" if decomposition else "apply_op_config", [any_op, *params], [],
        arg_attrs=[readonly] * (1 + len(params)),
    )
    with ir.InsertionPoint(apply.body):
        transform.AnnotateOp(apply.bodyTarget, "compilation_info", param=apply.bodyExtraArgs[0])
        if decomposition:
            transform.AnnotateOp(
                apply.bodyTarget, DECOMPOSITION_KEY, param=apply.bodyExtraArgs[1]
            )
        transform.YieldOp([])


def _parse_config(problem: Problem, config: str) -> Any:
    from iree.compiler import ir

    try:
        return ir.Attribute.parse(config)
    except ir.MLIRError as exc:
        raise DispatchTuneError(
            f"invalid compilation_info for {problem.key}: {mlir_error_line(exc)}"
        ) from None


def _split_decomposition(problem: Problem, config: str) -> tuple[str, str]:
    """(compilation_info, decomposition_config) of a config; "" when it has none.

    GPU attention candidates carry their `decomposition_config` inside the lowering_config
    dictionary (`search.gpu.materialize`); IREE reads it from the op's own attribute, so it is
    moved there. Any other config is returned unchanged (CPU specs stay byte-identical).
    """
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen, iree_gpu

    if DECOMPOSITION_KEY not in config:
        return config, ""
    info = iree_codegen.CompilationInfoAttr(_parse_config(problem, config))
    if not iree_gpu.LoweringConfigAttr.isinstance(info.lowering_config):
        return config, ""
    lowering = iree_gpu.LoweringConfigAttr(info.lowering_config).attributes
    entries = {lowering[i].name: lowering[i].attr for i in range(len(lowering))}
    if DECOMPOSITION_KEY not in entries:
        return config, ""
    decomposition = entries.pop(DECOMPOSITION_KEY)
    config_attr = iree_gpu.LoweringConfigAttr.get(ir.DictAttr.get(entries))
    stripped = iree_codegen.CompilationInfoAttr.get(config_attr, info.translation_info)
    return str(stripped), str(decomposition)


def _emit_match(problem: Problem, handle: Any) -> None:
    """Matcher ops for one problem: op kind, element types, indexing maps, every dimension size."""
    from iree.compiler import ir
    from iree.compiler.dialects import preprocessing_transform as pt

    types = [ir.Type.parse(t) for t in problem.element_types]
    maps = [
        ir.AffineMapAttr(ir.Attribute.parse(f"affine_map<{m}>")).value
        for m in problem.indexing_maps
    ]
    if problem.kind == "contraction":
        dims = pt.MatchContractionOp(handle, types[0], types[1], types[2], maps).results
        expected = [problem.sizes(c) for c in DIM_CLASSES["contraction"]]
    elif problem.kind == "convolution":
        dims = pt.MatchConvolutionOp(handle, types[0], types[1], types[2], maps).results
        expected = [problem.sizes(c) for c in DIM_CLASSES["convolution"]]
        expected += [problem.strides, problem.dilations]
    else:
        q, k, v, o = maps
        scale = ir.AffineMap.get(q.n_dims, 0, [])
        dims = pt.MatchAttentionOp(
            handle, types[0], types[1], types[2], types[3], [q, k, v, scale, o]
        ).results
        expected = [problem.sizes(c) for c in DIM_CLASSES["attention"]]
    for value, sizes in zip(dims, expected, strict=True):
        pt.MatchDimsEqualOp(value, list(sizes))


def _emit_online_match(problem: Problem, handle: Any) -> None:
    """`transform.iree.match.online_attention` plus `dims_equal` on every dimension class.

    GPU targets convert attention to online_attention with f32 output, max and sum before
    tuning specs are applied (IREE's own gfx942 spec matches it the same way).
    """
    from iree.compiler import ir
    from iree.compiler.dialects import preprocessing_transform as pt

    q_t, k_t, v_t = (ir.Type.parse(t) for t in problem.element_types[:3])
    acc = ir.F32Type.get()
    q, k, v, o = (f"affine_map<{m}>" for m in problem.indexing_maps)
    domain = problem.indexing_maps[3].split("->")[0].strip()
    out_dims = [d.strip() for d in problem.indexing_maps[3].split("->")[1].strip(" ()").split(",")]
    n_dims = {f"d{i}" for i in problem.loops("n")}
    row = f"affine_map<{domain} -> ({', '.join(d for d in out_dims if d not in n_dims)})>"
    mask = [f"affine_map<{problem.mask_map}>"] if problem.mask_map else []
    maps = [q, k, v, f"affine_map<{domain} -> ()>", *mask, o, row, row]
    param = _i64_param_type()
    scale_t = ir.Type.parse(problem.attention_scale_type)
    dims = pt.MatchOnlineAttentionOp(
        param, param, param, param, param, handle, q_t, k_t, v_t, scale_t, acc, acc, acc,
        ir.ArrayAttr.get([ir.Attribute.parse(m) for m in maps]),
    ).results
    for value, sizes in zip(dims, [problem.sizes(c) for c in DIM_CLASSES["attention"]],
                            strict=True):
        pt.MatchDimsEqualOp(value, list(sizes))


def _i64_param_type() -> Any:
    """`!transform.param<i64>`, the type of matched dimension lists."""
    from iree.compiler import ir

    return ir.Type.parse("!transform.param<i64>")


def _online_attention_matcher(
    problem: Problem, config: str, name: str, decomposition: str = ""
) -> str:
    """A DAG matcher for the `online_attention` form of an attention problem, as MLIR text.

    llvm-cpu converts attention to `iree_linalg_ext.online_attention` before tuning specs are
    applied, and `transform.iree.match.attention` matches only the original op (measured with IREE
    3.13: its config is silently not applied), so the op is matched structurally instead: exact
    operand types, indexing maps and the running max/sum outputs that the conversion adds. With a
    `decomposition` (GPU) the matcher yields it too, and the output, max and sum are the f32
    accumulators GPU targets convert to.
    """
    q_t, k_t, v_t, o_t = (
        f"tensor<{'x'.join(map(str, s))}x{t}>"
        for s, t in zip(problem.operand_shapes, problem.element_types, strict=True)
    )
    acc_t = "f32" if decomposition else problem.output_type
    if decomposition:
        o_t = f"tensor<{'x'.join(map(str, problem.operand_shapes[3]))}x{acc_t}>"
    domain = problem.indexing_maps[3].split("->")[0].strip()
    out_dims = [d.strip() for d in problem.indexing_maps[3].split("->")[1].strip(" ()").split(",")]
    n_dims = {f"d{i}" for i in problem.loops("n")}
    row_dims = [d for d in out_dims if d not in n_dims]
    row_t = f"tensor<{'x'.join(str(problem.loop_sizes[int(d[1:])]) for d in row_dims)}x{acc_t}>"
    row_map = f"{domain} -> ({', '.join(row_dims)})"
    scale_t = problem.attention_scale_type
    mask_t = (
        f"tensor<{'x'.join(map(str, problem.mask_shape))}x{problem.mask_type}>"
        if problem.mask_map else ""
    )
    q, k, v, o = problem.indexing_maps
    maps = [q, k, v, f"{domain} -> ()", *([problem.mask_map] if mask_t else []), o, row_map, row_map]
    ins = ["%q", "%k", "%v", "%s", *(["%mask"] if mask_t else [])]
    in_types = [q_t, k_t, v_t, scale_t, *([mask_t] if mask_t else [])]
    block_args = ", ".join(
        f"{n}: {t}" for n, t in zip([*ins, "%o", "%m", "%l"], [*in_types, o_t, row_t, row_t],
                                    strict=True)
    )
    params = ", !transform.any_param" * (2 if decomposition else 1)
    yielded = "%op, %config, %decomposition" if decomposition else "%op, %config"
    constant = (f"\n    %decomposition = transform.param.constant {decomposition} -> "
                "!transform.any_param" if decomposition else "")
    return f"""module attributes {{transform.with_named_sequence}} {{
  transform.named_sequence @{name}(%op: !transform.any_op {{transform.readonly}})
      -> (!transform.any_op{params}) {{
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {{
    ^bb0({block_args}):
      %r:3 = iree_linalg_ext.online_attention <indexing_maps = [{
          ", ".join(f"affine_map<{m}>" for m in maps)}]>
          ins({", ".join(ins)} : {", ".join(in_types)}) outs(%o, %m, %l : {o_t}, {row_t}, {row_t}) {{
      ^bb0(%score: {acc_t}):
        iree_linalg_ext.yield %score : {acc_t}
      }} -> {o_t}, {row_t}, {row_t}
    }} : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %config = transform.param.constant {config} -> !transform.any_param{constant}
    transform.yield {yielded} : !transform.any_op{params}
  }}
}}"""


def merge_specs(specs: Sequence[str]) -> str:
    """Link several specs (e.g. a user's starter spec and ours) into one, with IREE's linker.

    Every matcher is kept, in the order the specs are given.
    """
    if not specs:
        return tuning_spec([])
    if len(specs) == 1:
        return specs[0]
    from iree.compiler import ir

    with ir.Context(), ir.Location.unknown():
        container = ir.Module.create()
        container.operation.attributes["transform.with_named_sequence"] = ir.UnitAttr.get()
        for i, text in enumerate(specs):
            try:
                module = ir.Module.parse(text)
            except ir.MLIRError as exc:
                raise DispatchTuneError(f"invalid tuning spec #{i}: {mlir_error_line(exc)}") from None
            # Nest each spec as a named module; the linker merges their `__kernel_config`s.
            nested = module.operation.clone(ip=ir.InsertionPoint(container.body))
            nested.attributes["sym_name"] = ir.StringAttr.get(f"spec_{i}")
        container_text = str(container)
    proc = run_tool(
        "iree-opt", ["-", "--iree-codegen-link-tuning-specs", "-o", "-"], input_text=container_text
    )
    if proc.returncode != 0:
        raise DispatchTuneError(f"linking tuning specs failed: {first_error_line(proc.stderr)}")
    return proc.stdout


def check_spec(text: str) -> None:
    """Parse and verify a spec in-process; raise a one-line error if it is not a valid spec."""
    from iree.compiler import ir

    with ir.Context():
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as exc:
            raise DispatchTuneError(f"invalid tuning spec: {mlir_error_line(exc)}") from None
        if "transform.with_named_sequence" not in module.operation.attributes:
            raise DispatchTuneError("tuning spec lacks the transform.with_named_sequence attribute")
        if not module.operation.verify():  # pragma: no cover - verify raises on failure
            raise DispatchTuneError("tuning spec failed to verify")


def applied_configs(
    mlir_path: str | Path, target: Target, spec_path: str | Path | None,
    flags: Sequence[str] | None = None,
) -> list[str]:
    """The configuration IREE applies to each root op of `mlir_path` with this spec.

    Compiles to `executable-configurations` (about 0.3 s) and returns, per root op, a
    `#iree_codegen.compilation_info<...>` built from the op's `lowering_config` and its function's
    `translation_info`, so it compares directly with the requested one (`config_applied`).
    `flags` replace the target's compile flags (a model that builds only with extra ones).
    """
    args = [
        str(mlir_path),
        *(target.compile_flags if flags is None else flags),
        "--compile-to=executable-configurations",
        "--iree-codegen-add-tuner-attributes",
        "-o",
        "-",
    ]
    if spec_path is not None:
        args.extend(target.tuning_spec_flags(spec_path))
    proc = run_tool("iree-compile", args)
    if proc.returncode != 0:
        raise DispatchTuneError(f"iree-compile failed: {first_error_line(proc.stderr)}")
    return configured_compilation_infos(proc.stdout)


def config_applied(requested: str, applied: str) -> bool:
    """Whether an applied configuration is the requested one (compared as parsed attributes)."""
    from iree.compiler import ir

    if not applied:
        return False
    with ir.Context():
        try:
            want = ir.Attribute.parse(requested)
            got = ir.Attribute.parse(applied)
        except ir.MLIRError:
            return False
        return bool(want == got)


def write_spec(text: str, path: str | Path) -> Path:
    """Write a spec file atomically (a half-written spec must never be picked up by a compile)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
        handle.write(text)
        tmp = Path(handle.name)
    tmp.replace(path)
    return path

