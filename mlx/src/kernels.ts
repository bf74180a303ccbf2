// mx.fast.metal_kernel and mx.fast.cuda_kernel: MLX's custom-kernel primitive, as Python exposes it.
//
// The kernel object is MLX's own CustomKernelFunction, built in the shim (mlxb_kernel_new) and
// called with Python's call arguments (inputs, output shapes and dtypes, grid, threadgroup,
// template, init_value, verbose). mlx-vlm's TurboQuant runs its codecs through metal_kernel on
// macOS; with this binding the same kernel sources can run here. Off its back-end (metal_kernel on
// Linux, cuda_kernel without CUDA) MLX raises its own error when the kernel is called, and it comes
// back through the binding's one error path (MlxError) with MLX's message unchanged.
import { handles, MlxArray, ownVec } from "./array.ts";
import { type Dtype, dtypeCode } from "./dtype.ts";
import { checkPtr, checkStatus, MlxError } from "./errors.ts";
import { cstr, lib } from "./native.ts";

/** A template argument: a number is an int, a boolean a bool, a string a dtype name ("float32"). */
export type TemplateArg = number | boolean | Dtype;

export interface KernelCall {
  inputs: readonly MlxArray[];
  outputShapes: readonly (readonly number[])[];
  outputDtypes: readonly Dtype[];
  grid: readonly [number, number, number];
  threadgroup: readonly [number, number, number];
  template?: readonly (readonly [string, TemplateArg])[];
  initValue?: number | null;
  verbose?: boolean;
}

export interface KernelSpec {
  name: string;
  inputNames: readonly string[];
  outputNames: readonly string[];
  source: string;
  header?: string;
  ensureRowContiguous?: boolean;
}

/** A built kernel: call it like Python's kernel object; dispose it when done. */
export class CustomKernel implements Disposable {
  #handle: number;
  readonly #op: string;

  constructor(handle: number, op: string) {
    this.#handle = handle;
    this.#op = op;
  }

  call({ inputs, outputShapes, outputDtypes, grid, threadgroup, template = [], initValue = null, verbose = false }: KernelCall): MlxArray[] {
    const op = this.#op;
    if (this.#handle === 0) throw new MlxError(op, "the kernel was disposed");
    if (outputShapes.length !== outputDtypes.length) throw new MlxError(op, `${outputShapes.length} output shapes but ${outputDtypes.length} output dtypes`);
    const triple = (t: readonly number[], what: string) => {
      if (t.length !== 3 || !t.every((x) => Number.isInteger(x) && x >= 0 && x <= 2 ** 31 - 1)) throw new MlxError(op, `${what} must be three non-negative integers`);
      return Int32Array.from(t);
    };
    const ndims = Int32Array.from(outputShapes, (s) => s.length);
    const flat: number[] = [];
    for (const s of outputShapes) {
      for (const d of s) {
        if (!Number.isInteger(d) || d < 0 || d > 2 ** 31 - 1) throw new MlxError(op, `output shape dimensions must be non-negative integers, got ${JSON.stringify(s)}`);
        flat.push(d);
      }
    }
    const kinds = new Int32Array(template.length);
    const vals = new Int32Array(template.length);
    template.forEach(([name, v], i) => {
      if (name.includes("\0")) throw new MlxError(op, "a template name holds a NUL character");
      if (typeof v === "boolean") [kinds[i], vals[i]] = [1, v ? 1 : 0];
      else if (typeof v === "number") {
        if (!Number.isInteger(v) || Math.abs(v) > 2 ** 31 - 1) throw new MlxError(op, `template argument ${name} must be an int32, got ${v}`);
        [kinds[i], vals[i]] = [0, v];
      } else [kinds[i], vals[i]] = [2, dtypeCode(v)];
    });
    const names = Buffer.from(template.map(([n]) => `${n}\0`).join(""), "utf8");
    return ownVec(
      lib.mlxb_kernel_call(
        this.#handle,
        handles(inputs),
        inputs.length,
        Int32Array.from(flat),
        ndims,
        Int32Array.from(outputDtypes, (d) => dtypeCode(d)),
        outputShapes.length,
        triple(grid, "grid"),
        triple(threadgroup, "threadgroup"),
        names,
        kinds,
        vals,
        template.length,
        initValue ?? 0,
        initValue === null || initValue === undefined ? 0 : 1,
        verbose ? 1 : 0,
      ),
      op,
    );
  }

  dispose(): void {
    if (this.#handle !== 0) checkStatus(lib.mlxb_kernel_free(this.#handle), this.#op);
    this.#handle = 0;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

function packNames(names: readonly string[], op: string, what: string): Buffer {
  for (const n of names) if (typeof n !== "string" || n.includes("\0")) throw new MlxError(op, `${what} must be strings without NUL characters`);
  return Buffer.from(names.map((n) => `${n}\0`).join(""), "utf8");
}

function build(backend: 0 | 1, op: string, spec: KernelSpec, atomicOutputs: boolean, sharedMemory: number): CustomKernel {
  const { name, inputNames, outputNames, source, header = "", ensureRowContiguous = true } = spec;
  if (!Number.isInteger(sharedMemory) || sharedMemory < 0) throw new MlxError(op, `shared_memory must be a non-negative integer, got ${sharedMemory}`);
  const h = lib.mlxb_kernel_new(
    backend,
    cstr(name),
    packNames(inputNames, op, "input_names"),
    inputNames.length,
    packNames(outputNames, op, "output_names"),
    outputNames.length,
    cstr(source),
    cstr(header),
    ensureRowContiguous ? 1 : 0,
    atomicOutputs ? 1 : 0,
    sharedMemory,
  );
  return new CustomKernel(checkPtr(h, op), op);
}

/** mx.fast.metal_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True, atomic_outputs=False). */
export function metalKernel(spec: KernelSpec & { atomicOutputs?: boolean }): CustomKernel {
  return build(0, "fast.metal_kernel", spec, spec.atomicOutputs ?? false, 0);
}

/** mx.fast.cuda_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True, shared_memory=0). */
export function cudaKernel(spec: KernelSpec & { sharedMemory?: number }): CustomKernel {
  return build(1, "fast.cuda_kernel", spec, false, spec.sharedMemory ?? 0);
}
