// mx.compile: the function is traced through a JS callback into MLX's compiler, keyed by a
// per-closure id exactly as Python keys it by function id, so the same graph yields the same
// fused kernel (and the same cached .so) as Python.
import { FFIType, JSCallback } from "bun:ffi";
import { handles, MlxArray, own, ownVec } from "./array.ts";
import { checkPtr, checkStatus, MlxError } from "./errors.ts";
import { lib } from "./native.ts";

export type Traceable = (...inputs: MlxArray[]) => MlxArray | MlxArray[];

export interface CompiledFunction<F extends Traceable> extends Disposable {
  (...inputs: MlxArray[]): ReturnType<F>;
  dispose(): void;
}

/** Captured implicit state (Python's compile `inputs=`/`outputs=`), e.g. `random.state`. */
export interface CompileState {
  /** Current arrays, as new handles owned by the caller. */
  get(): MlxArray[];
  /** Replaces the state; takes ownership of the arrays. */
  set(arrays: MlxArray[]): void;
}

export interface CompileOptions {
  shapeless?: boolean;
  /** State read as extra inputs on every call (Python `inputs=`). */
  inputs?: CompileState;
  /** State written back from extra outputs after every call (Python `outputs=`). */
  outputs?: CompileState;
}

export function compile<F extends Traceable>(fn: F, { shapeless = false, inputs: stateIn, outputs: stateOut }: CompileOptions = {}): CompiledFunction<F> {
  let single: boolean | undefined;
  let traceError: unknown = null;
  // Number of user inputs of the call being traced (the rest are captured state).
  let userCount = 0;
  let stateOutCount = 0;

  const trace = new JSCallback(
    (vec: number): number | null => {
      const inputs: MlxArray[] = [];
      let outputs: MlxArray[] = [];
      try {
        const n = checkStatus(lib.mlxb_vec_size(vec), "compile");
        for (let i = 0; i < n; i++) inputs.push(own(lib.mlxb_vec_get(vec, i), "compile"));
        if (stateIn) stateIn.set(inputs.slice(userCount).map((a) => own(lib.mlxb_retain(a.handle), "compile")));
        const result = fn(...inputs.slice(0, userCount));
        single = !Array.isArray(result);
        outputs = Array.isArray(result) ? [...result] : [result];
        if (stateOut) {
          const st = stateOut.get();
          stateOutCount = st.length;
          outputs.push(...st);
        }
        const hs = handles(outputs);
        return checkPtr(lib.mlxb_vec_new(hs.length ? hs : new Float64Array(1), hs.length), "compile");
      } catch (e) {
        traceError = e;
        return null;
      } finally {
        for (const a of inputs) a.dispose();
        for (const a of outputs) if (!inputs.includes(a)) a.dispose();
      }
    },
    { args: [FFIType.ptr], returns: FFIType.ptr },
  );

  let handle: number = checkPtr(lib.mlxb_compile(trace.ptr, shapeless ? 1 : 0), "compile");

  const call = ((...inputs: MlxArray[]) => {
    if (handle === 0) throw new MlxError("compile", "compiled function used after dispose()");
    const extra = stateIn ? stateIn.get() : [];
    const hs = handles(extra.length ? [...inputs, ...extra] : inputs);
    userCount = inputs.length;
    traceError = null;
    const p = lib.mlxb_compiled_call(handle, hs.length ? hs : new Float64Array(1), hs.length);
    for (const a of extra) a.dispose();
    if (p === null || p === 0) {
      const e = traceError;
      traceError = null;
      if (e !== null) throw e;
    }
    const outs = ownVec(p, "compile");
    if (stateOut) stateOut.set(outs.splice(outs.length - stateOutCount, stateOutCount));
    return single ? outs[0] : outs;
  }) as CompiledFunction<F>;

  call.dispose = () => {
    if (handle === 0) return;
    lib.mlxb_compiled_free(handle);
    handle = 0;
    trace.close();
  };
  call[Symbol.dispose] = call.dispose;
  return call;
}

/** 0 disabled, 1 no_simplify, 2 no_fuse, 3 enabled (mlx::core::CompileMode). */
export function setCompileMode(mode: "disabled" | "no_simplify" | "no_fuse" | "enabled"): void {
  const code = ["disabled", "no_simplify", "no_fuse", "enabled"].indexOf(mode);
  checkStatus(lib.mlxb_set_compile_mode(code), "set_compile_mode");
}

/**
 * Several captured states as one, in order (Python's `inputs=[model.state, optimizer.state,
 * mx.random.state]`). set() splits its arrays by the sizes the last get() saw: inside a trace
 * that is the outputs' get() at the end of the trace, in a replayed call the inputs' get().
 */
export function combineStates(...states: CompileState[]): CompileState {
  let sizes: number[] = [];
  return {
    get() {
      const parts = states.map((s) => s.get());
      sizes = parts.map((p) => p.length);
      return parts.flat();
    },
    set(arrays) {
      const total = sizes.reduce((a, b) => a + b, 0);
      if (arrays.length !== total) throw new MlxError("compile", `combined state: ${arrays.length} arrays for ${total} slots`);
      let at = 0;
      states.forEach((s, i) => {
        s.set(arrays.slice(at, at + sizes[i]!));
        at += sizes[i]!;
      });
    },
  };
}
