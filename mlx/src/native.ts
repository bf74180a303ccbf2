// The one symbol table of the native shim (mlx/native/shim.cpp).
import { dlopen, FFIType, CString, suffix } from "bun:ffi";
import { existsSync } from "node:fs";
import { join } from "node:path";

const { ptr, i32, f32, f64 } = FFIType;

export const libraryPath: string =
  process.env.MLX_BUN_LIB ?? join(import.meta.dir, "..", "build", `libmlx_bun.${suffix}`);

if (!existsSync(libraryPath)) {
  throw new Error(
    `@mlx-bun/mlx: native library not found at ${libraryPath}. Run \`npm run setup\` (or \`npm test\`) to build it.`,
  );
}

const symbols = {
  mlxb_last_error: { args: [], returns: ptr },
  mlxb_clear_error: { args: [], returns: FFIType.void },
  mlxb_live_handles: { args: [], returns: f64 },
  mlxb_free: { args: [ptr], returns: i32 },
  mlxb_is_live: { args: [ptr], returns: i32 },
  mlxb_retain: { args: [ptr], returns: ptr },
  mlxb_version: { args: [], returns: ptr },
  mlxb_ndim: { args: [ptr], returns: i32 },
  mlxb_dim: { args: [ptr, i32], returns: i32 },
  mlxb_dtype: { args: [ptr], returns: i32 },
  mlxb_size: { args: [ptr], returns: f64 },
  mlxb_nbytes: { args: [ptr], returns: f64 },
  mlxb_unary_count: { args: [], returns: i32 },
  mlxb_unary_name: { args: [i32], returns: ptr },
  mlxb_binary_count: { args: [], returns: i32 },
  mlxb_binary_name: { args: [i32], returns: ptr },
  mlxb_reduce_count: { args: [], returns: i32 },
  mlxb_reduce_name: { args: [i32], returns: ptr },
  mlxb_vec_new: { args: [ptr, i32], returns: ptr },
  mlxb_vec_size: { args: [ptr], returns: i32 },
  mlxb_vec_get: { args: [ptr, i32], returns: ptr },
  mlxb_vec_free: { args: [ptr], returns: i32 },
  mlxb_from_bytes: { args: [ptr, f64, ptr, i32, i32], returns: ptr },
  mlxb_scalar: { args: [f64, i32, i32], returns: ptr },
  mlxb_copy_out: { args: [ptr, ptr, f64], returns: i32 },
  mlxb_arange: { args: [f64, f64, f64, i32], returns: ptr },
  mlxb_zeros: { args: [ptr, i32, i32], returns: ptr },
  mlxb_ones: { args: [ptr, i32, i32], returns: ptr },
  mlxb_full: { args: [ptr, i32, ptr, i32], returns: ptr },
  mlxb_astype: { args: [ptr, i32], returns: ptr },
  mlxb_view: { args: [ptr, i32], returns: ptr },
  mlxb_unary: { args: [i32, ptr], returns: ptr },
  mlxb_binary: { args: [i32, ptr, ptr], returns: ptr },
  mlxb_binary_scalar: { args: [i32, ptr, f64, i32, i32], returns: ptr },
  mlxb_where: { args: [ptr, ptr, ptr, f64, i32], returns: ptr },
  mlxb_clip: { args: [ptr, ptr, ptr], returns: ptr },
  mlxb_clip_scalar: { args: [ptr, ptr, f64, i32, ptr, f64, i32], returns: ptr },
  mlxb_linspace: { args: [f64, f64, i32, i32], returns: ptr },
  mlxb_eye: { args: [i32, i32, i32, i32], returns: ptr },
  mlxb_round: { args: [ptr, i32], returns: ptr },
  mlxb_reduce: { args: [i32, ptr, ptr, i32, i32, i32, i32], returns: ptr },
  mlxb_argreduce: { args: [i32, ptr, i32, i32, i32], returns: ptr },
  mlxb_softmax: { args: [ptr, ptr, i32, i32, i32], returns: ptr },
  mlxb_cumulative: { args: [i32, ptr, i32, i32, i32], returns: ptr },
  mlxb_sortlike: { args: [i32, ptr, i32, i32, i32], returns: ptr },
  mlxb_reshape: { args: [ptr, ptr, i32], returns: ptr },
  mlxb_flatten: { args: [ptr, i32, i32], returns: ptr },
  mlxb_unflatten: { args: [ptr, i32, ptr, i32], returns: ptr },
  mlxb_transpose: { args: [ptr, ptr, i32], returns: ptr },
  mlxb_swapaxes: { args: [ptr, i32, i32], returns: ptr },
  mlxb_moveaxis: { args: [ptr, i32, i32], returns: ptr },
  mlxb_expand_dims: { args: [ptr, ptr, i32], returns: ptr },
  mlxb_squeeze: { args: [ptr, ptr, i32], returns: ptr },
  mlxb_broadcast_to: { args: [ptr, ptr, i32], returns: ptr },
  mlxb_concatenate: { args: [ptr, i32, i32], returns: ptr },
  mlxb_stack: { args: [ptr, i32, i32], returns: ptr },
  mlxb_split: { args: [ptr, i32, ptr, i32, i32], returns: ptr },
  mlxb_slice: { args: [ptr, ptr, ptr, ptr, i32], returns: ptr },
  mlxb_slice_dynamic: { args: [ptr, ptr, ptr, i32, ptr, i32], returns: ptr },
  mlxb_slice_update: { args: [ptr, ptr, ptr, ptr, ptr, i32], returns: ptr },
  mlxb_slice_update_dynamic: { args: [ptr, ptr, ptr, ptr, i32], returns: ptr },
  mlxb_take: { args: [ptr, ptr, i32, i32], returns: ptr },
  mlxb_take_along_axis: { args: [ptr, ptr, i32], returns: ptr },
  mlxb_put_along_axis: { args: [ptr, ptr, ptr, i32], returns: ptr },
  mlxb_roll: { args: [ptr, i32, i32, i32], returns: ptr },
  mlxb_contiguous: { args: [ptr, i32], returns: ptr },
  mlxb_repeat: { args: [ptr, i32, i32, i32], returns: ptr },
  mlxb_tile: { args: [ptr, ptr, i32], returns: ptr },
  mlxb_pad: { args: [ptr, ptr, i32, ptr, ptr, ptr], returns: ptr },
  mlxb_tri: { args: [i32, i32, i32, i32], returns: ptr },
  mlxb_trilu: { args: [ptr, i32, i32], returns: ptr },
  mlxb_depends: { args: [ptr, i32, ptr, i32], returns: ptr },
  mlxb_addmm: { args: [ptr, ptr, ptr, f32, f32], returns: ptr },
  mlxb_quantize: { args: [ptr, i32, i32, ptr, ptr], returns: ptr },
  mlxb_dequantize: { args: [ptr, ptr, ptr, i32, i32, ptr, ptr, i32], returns: ptr },
  mlxb_quantized_matmul: { args: [ptr, ptr, ptr, ptr, i32, i32, i32, ptr], returns: ptr },
  mlxb_gather_mm: { args: [ptr, ptr, ptr, ptr, i32], returns: ptr },
  mlxb_gather_qmm: { args: [ptr, ptr, ptr, ptr, ptr, ptr, i32, i32, i32, ptr, ptr, i32], returns: ptr },
  mlxb_rms_norm: { args: [ptr, ptr, f32], returns: ptr },
  mlxb_layer_norm: { args: [ptr, ptr, ptr, f32], returns: ptr },
  mlxb_rope: { args: [ptr, i32, i32, f32, i32, f32, i32, ptr, ptr], returns: ptr },
  mlxb_sdpa: { args: [ptr, ptr, ptr, f32, ptr, ptr, ptr], returns: ptr },
  mlxb_eval: { args: [ptr, i32], returns: i32 },
  mlxb_async_eval: { args: [ptr, i32], returns: i32 },
  mlxb_random_key: { args: [f64], returns: ptr },
  mlxb_random_split: { args: [ptr, i32], returns: ptr },
  mlxb_random_uniform: { args: [ptr, ptr, ptr, i32, i32, ptr], returns: ptr },
  mlxb_random_normal: { args: [ptr, i32, i32, ptr, ptr, ptr], returns: ptr },
  mlxb_random_categorical: { args: [ptr, i32, ptr, i32, i32, ptr], returns: ptr },
  mlxb_random_bits: { args: [ptr, i32, i32, ptr], returns: ptr },
  mlxb_load_safetensors: { args: [ptr], returns: ptr },
  mlxb_loaded_count: { args: [ptr, i32], returns: i32 },
  mlxb_loaded_key: { args: [ptr, i32, i32], returns: ptr },
  mlxb_loaded_meta_value: { args: [ptr, i32], returns: ptr },
  mlxb_loaded_array: { args: [ptr, i32], returns: ptr },
  mlxb_loaded_free: { args: [ptr], returns: FFIType.void },
  mlxb_save_safetensors: { args: [ptr, ptr, ptr, i32, ptr, ptr, i32], returns: i32 },
  mlxb_compile: { args: [FFIType.function, i32], returns: ptr },
  mlxb_compiled_call: { args: [ptr, ptr, i32], returns: ptr },
  mlxb_compiled_free: { args: [ptr], returns: i32 },
  mlxb_set_compile_mode: { args: [i32], returns: i32 },
  mlxb_bench_chain: { args: [ptr, ptr, i32, i32], returns: f64 },
  mlxb_memory: { args: [i32], returns: f64 },
  mlxb_reset_peak_memory: { args: [], returns: i32 },
  mlxb_clear_cache: { args: [], returns: i32 },
  mlxb_set_limit: { args: [i32, f64], returns: f64 },
  mlxb_gpu_backend: { args: [], returns: i32 },
  mlxb_gpu_name: { args: [], returns: ptr },
  mlxb_default_device: { args: [], returns: i32 },
  mlxb_set_default_device: { args: [i32], returns: i32 },
  mlxb_is_available: { args: [i32], returns: i32 },
  mlxb_new_stream: { args: [i32], returns: i32 },
  mlxb_default_stream_index: { args: [i32], returns: i32 },
  mlxb_synchronize: { args: [], returns: i32 },
  mlxb_set_default_stream: { args: [i32, i32], returns: i32 },
  mlxb_synchronize_stream: { args: [i32, i32], returns: i32 },
  mlxb_set_wired_limit: { args: [f64], returns: f64 },
  mlxb_primitive_name: { args: [ptr], returns: ptr },
  mlxb_is_evaluated: { args: [ptr], returns: i32 },
  mlxb_num_inputs: { args: [ptr], returns: i32 },
  mlxb_input: { args: [ptr, i32], returns: ptr },
  mlxb_array_id: { args: [ptr], returns: f64 },
  mlxb_graph_nodes: { args: [ptr], returns: ptr },
  mlxb_graph_replay: { args: [ptr, ptr, ptr, i32], returns: ptr },
  // convolution and einsum (multimodal towers)
  mlxb_conv2d: { args: [ptr, ptr, i32, i32, i32, i32, i32, i32, i32], returns: ptr },
  mlxb_conv_general: { args: [ptr, ptr, ptr, i32, ptr, i32, ptr, i32, ptr, i32, ptr, i32, i32, i32], returns: ptr },
  mlxb_einsum: { args: [ptr, ptr, i32], returns: ptr },
  // autodiff (autodiff.ts): one JS trampoline, closures released through a queue
  mlxb_set_trampoline: { args: [FFIType.function], returns: i32 },
  mlxb_next_released: { args: [], returns: f64 },
  mlxb_vjp: { args: [f64, ptr, i32, ptr, i32], returns: ptr },
  mlxb_jvp: { args: [f64, ptr, i32, ptr, i32], returns: ptr },
  mlxb_value_and_grad: { args: [f64, ptr, i32, ptr, i32], returns: ptr },
  mlxb_checkpoint: { args: [f64, ptr, i32], returns: ptr },
  // reliability (issue 15)
  mlxb_loaded_key_length: { args: [ptr, i32, i32], returns: i32 },
  // tuner (mlx_lm/tuner)
  mlxb_random_bernoulli: { args: [ptr, ptr, i32, ptr], returns: ptr },
  mlxb_fast_cross_entropy: { args: [ptr, ptr], returns: ptr },
  // custom kernels (kernels.ts): mx.fast.metal_kernel / cuda_kernel
  mlxb_kernel_new: { args: [i32, ptr, ptr, i32, ptr, i32, ptr, ptr, i32, i32, i32], returns: ptr },
  mlxb_kernel_call: { args: [ptr, ptr, i32, ptr, ptr, ptr, i32, ptr, ptr, ptr, ptr, ptr, i32, f64, i32, i32], returns: ptr },
  mlxb_kernel_free: { args: [ptr], returns: i32 },
} as const;

type Arg = number | ArrayBufferView | null;
type Ret<R> = R extends typeof FFIType.ptr ? number | null : R extends typeof FFIType.void ? void : number;
type Native = { [K in keyof typeof symbols]: (...args: Arg[]) => Ret<(typeof symbols)[K]["returns"]> };

// Bun types pointers as branded numbers; the binding treats handles as plain numbers.
const raw = dlopen(libraryPath, symbols).symbols as unknown as Native;

let callCount = 0;

/** With MLX_BUN_COUNT_CALLS=1 every native call is counted (benchmarks); otherwise zero cost. */
function counting(l: Native): Native {
  const out: Record<string, unknown> = {};
  for (const [k, f] of Object.entries(l)) {
    out[k] = (...args: Arg[]) => {
      callCount++;
      return (f as (...a: Arg[]) => unknown)(...args);
    };
  }
  return out as Native;
}

export const lib: Native = process.env.MLX_BUN_COUNT_CALLS === "1" ? counting(raw) : raw;

/** Native calls made so far (always 0 unless MLX_BUN_COUNT_CALLS=1). */
export const nativeCallCount = (): number => callCount;

/** Reads a NUL-terminated C string returned as a pointer ("" for NULL). */
export function cstring(p: number | null): string {
  return p ? new CString(p as never).toString() : "";
}

/** NUL-terminated UTF-8 bytes for a `cstring` argument. */
export function cstr(s: string): Buffer {
  return Buffer.from(`${s}\0`, "utf8");
}
