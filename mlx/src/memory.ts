// MLX memory statistics and limits (bytes).
import { checkStatus } from "./errors.ts";
import { lib } from "./native.ts";

export const getActiveMemory = (): number => checkStatus(lib.mlxb_memory(0), "get_active_memory");
export const getPeakMemory = (): number => checkStatus(lib.mlxb_memory(1), "get_peak_memory");
export const getCacheMemory = (): number => checkStatus(lib.mlxb_memory(2), "get_cache_memory");
export const getMemoryLimit = (): number => checkStatus(lib.mlxb_memory(3), "get_memory_limit");
export const resetPeakMemory = (): void => void checkStatus(lib.mlxb_reset_peak_memory(), "reset_peak_memory");
export const clearCache = (): void => void checkStatus(lib.mlxb_clear_cache(), "clear_cache");
/** Returns the previous limit. */
export const setMemoryLimit = (bytes: number): number => checkStatus(lib.mlxb_set_limit(0, bytes), "set_memory_limit");
/** Returns the previous limit. */
export const setCacheLimit = (bytes: number): number => checkStatus(lib.mlxb_set_limit(1, bytes), "set_cache_limit");
/** mx.set_wired_limit (Metal only; a no-op returning 0 elsewhere). Returns the previous limit. */
export const setWiredLimit = (bytes: number): number => checkStatus(lib.mlxb_set_wired_limit(bytes), "set_wired_limit");
/** Native array handles currently alive (for leak tests). */
export const liveHandles = (): number => lib.mlxb_live_handles();
