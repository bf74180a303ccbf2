// A host-side tensor: what a preprocessing step hands the model (numpy's array, before
// mx.array). C-order, little-endian, no MLX handle: the caller makes the mx.array.

export type HostArray =
  | { dtype: "float32"; shape: number[]; data: Float32Array }
  | { dtype: "uint8"; shape: number[]; data: Uint8Array }
  | { dtype: "bool"; shape: number[]; data: Uint8Array }
  | { dtype: "int64"; shape: number[]; data: BigInt64Array };

/** The raw bytes of a host array (for byte-for-byte comparison and .npy files). */
export function hostBytes(a: HostArray): Uint8Array {
  return new Uint8Array(a.data.buffer, a.data.byteOffset, a.data.byteLength);
}
