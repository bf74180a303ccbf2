// Devices and streams.
import { checkStatus } from "./errors.ts";
import { cstring, lib } from "./native.ts";

export type DeviceType = "cpu" | "gpu";
const code = (t: DeviceType): number => (t === "cpu" ? 0 : 1);

export const defaultDevice = (): DeviceType => (checkStatus(lib.mlxb_default_device(), "default_device") === 0 ? "cpu" : "gpu");
export const setDefaultDevice = (t: DeviceType): void => void checkStatus(lib.mlxb_set_default_device(code(t)), "set_default_device");
export const isAvailable = (t: DeviceType): boolean => checkStatus(lib.mlxb_is_available(code(t)), "is_available") === 1;
/** Creates a new stream on the device; returns its index. */
export const newStream = (t: DeviceType): number => checkStatus(lib.mlxb_new_stream(code(t)), "new_stream");
export const defaultStreamIndex = (t: DeviceType): number => checkStatus(lib.mlxb_default_stream_index(code(t)), "default_stream");
export const synchronize = (): void => void checkStatus(lib.mlxb_synchronize(), "synchronize");
/** libmlx's version string, e.g. "0.32.4". */
export const version = (): string => cstring(lib.mlxb_version());
