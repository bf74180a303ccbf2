// The --device flag of the faces (parity, generate, bench): one device for both sides. The TS
// process makes it MLX's default, and MLX_DEVICE carries it to every oracle process
// (oracle/python/device_env.py), as the same variable does for `npm test`.
import * as mx from "@mlx-bun/mlx";
import { type FlagSpec, type Parsed, UsageError } from "./args.ts";

export const DEVICE_FLAG: FlagSpec = {
  name: "device",
  kind: "string",
  valueName: "cpu|gpu",
  help: "the device both sides run on (default: MLX_DEVICE, else MLX's default device: the GPU on a Metal or CUDA build)",
};

/** Where a run ran, for reports and fingerprints. */
export interface DeviceInfo {
  /** The GPU backend of this libmlx ("cuda", "metal", or "cpu" when it has none). */
  backend: mx.Backend;
  device: mx.DeviceType;
  /** The GPU's name, or "" without one. */
  gpu: string;
}

/** Applies --device (or MLX_DEVICE) before any oracle starts; a missing GPU is a usage error. */
export function applyDeviceFlag(value: Parsed[string]): DeviceInfo {
  const want = value === undefined ? process.env.MLX_DEVICE : String(value);
  if (want !== undefined && want !== "") {
    if (want !== "cpu" && want !== "gpu") throw new UsageError(`--device must be cpu or gpu, got '${want}'`);
    try {
      mx.selectDevice(want, "--device");
    } catch (e) {
      throw new UsageError(`--device ${want}: ${(e as mx.MlxError).detail}`);
    }
    process.env.MLX_DEVICE = want;
  }
  return deviceInfo();
}

export function deviceInfo(): DeviceInfo {
  return { backend: mx.backend(), device: mx.defaultDevice(), gpu: mx.gpuName() };
}
