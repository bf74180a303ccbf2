// Devices and streams.
import { checkPtr, checkStatus, MlxError } from "./errors.ts";
import { cstring, lib } from "./native.ts";

export type DeviceType = "cpu" | "gpu";
const code = (t: DeviceType): number => (t === "cpu" ? 0 : 1);

// The default device is set through this module only (in this process), so it is read from MLX
// once and then kept here: hot paths (the model's choice of decode route) ask for it per call.
let current: DeviceType | undefined;
export const defaultDevice = (): DeviceType => (current ??= checkStatus(lib.mlxb_default_device(), "default_device") === 0 ? "cpu" : "gpu");
export function setDefaultDevice(t: DeviceType): void {
  checkStatus(lib.mlxb_set_default_device(code(t)), "set_default_device");
  current = t;
}
export const isAvailable = (t: DeviceType): boolean => checkStatus(lib.mlxb_is_available(code(t)), "is_available") === 1;
/** Creates a new stream on the device; returns its index. */
export const newStream = (t: DeviceType): number => checkStatus(lib.mlxb_new_stream(code(t)), "new_stream");
/**
 * mx.new_thread_local_stream(device) (mlx-lm's generation_stream). The binding drives MLX from
 * the JS thread only, so this is a new stream of that thread.
 */
export const newThreadLocalStream = newStream;
export const defaultStreamIndex = (t: DeviceType): number => checkStatus(lib.mlxb_default_stream_index(code(t)), "default_stream");
/** mx.synchronize(stream?): waits for the default stream, or stream `index` of device `t`. */
export function synchronize(stream?: { device: DeviceType; index: number }): void {
  if (stream === undefined) checkStatus(lib.mlxb_synchronize(), "synchronize");
  else checkStatus(lib.mlxb_synchronize_stream(code(stream.device), stream.index), "synchronize");
}
/** mx.set_default_stream: makes stream `index` (from newStream) the default of its device on this thread. */
export const setDefaultStream = (t: DeviceType, index: number): void =>
  void checkStatus(lib.mlxb_set_default_stream(code(t), index), "set_default_stream");
/** `with mx.stream(s):` — runs fn with stream `index` of device `t` as the default, then restores. */
export function withStream<T>(t: DeviceType, index: number, fn: () => T): T {
  const prev = defaultStreamIndex(t);
  setDefaultStream(t, index);
  try {
    return fn();
  } finally {
    setDefaultStream(t, prev);
  }
}
/** The GPU backend libmlx can use here: "metal", "cuda", or "cpu" when it has no usable GPU. */
export type Backend = "cpu" | "metal" | "cuda";
const BACKENDS: readonly Backend[] = ["cpu", "metal", "cuda"];
export const backend = (): Backend => BACKENDS[checkStatus(lib.mlxb_gpu_backend(), "gpu_backend")]!;
/** The GPU's name as MLX reports it (gpu::device_info "device_name"), or "" without a GPU. */
export const gpuName = (): string => cstring(checkPtr(lib.mlxb_gpu_name(), "gpu_name"));

/**
 * Makes `name` ("cpu" or "gpu") the default device, as mx.set_default_device does, after
 * checking it exists; a GPU request where libmlx has none fails with one message saying which
 * backend this is. Used by the faces' --device flag and by MLX_DEVICE (applyDeviceEnv).
 */
export function selectDevice(name: string, source = "device"): DeviceType {
  if (name !== "cpu" && name !== "gpu") throw new MlxError(source, `unknown device '${name}' (expected cpu or gpu)`);
  if (name === "gpu" && !isAvailable("gpu")) {
    throw new MlxError(source, "no GPU is available to MLX here: this libmlx has the CPU backend only (on Linux, MLX_BACKEND=cuda npm run setup installs mlx-cuda-13 on a machine with an NVIDIA GPU; on macOS, mlx-metal uses the Apple GPU)");
  }
  setDefaultDevice(name);
  return name;
}

/**
 * The one environment variable for the device of a test run: MLX_DEVICE=cpu|gpu makes it the
 * default (the oracle server reads the same variable, so both sides run on one device). Unset:
 * MLX's own default device. Returns the device in use.
 */
export function applyDeviceEnv(env: Record<string, string | undefined> = process.env): DeviceType {
  const want = env.MLX_DEVICE;
  return want ? selectDevice(want, "MLX_DEVICE") : defaultDevice();
}

/** libmlx's version string, e.g. "0.32.4". */
export const version = (): string => cstring(lib.mlxb_version());
