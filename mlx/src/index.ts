// @mlx-bun/mlx: MLX for Bun, in mlx.core's vocabulary.
export { array, fromBytes, MlxArray, scalar } from "./array.ts";
export * from "./dtype.ts";
export { MlxError } from "./errors.ts";
export * from "./ops.ts";
export * as fast from "./fast.ts";
export * as random from "./random.ts";
export * from "./io.ts";
export * from "./transforms.ts";
export { combineStates, type CompiledFunction, type CompileState, compile, setCompileMode } from "./compile.ts";
export * from "./memory.ts";
export * from "./device.ts";
export { pyFloat, pyInt, PyScalar, type Scalar } from "./scalar.ts";
export * as graph from "./graph.ts";
export { checkpoint, grad, jvp, liveTracedFunctions, valueAndGrad, vjp, type ArrayFunction, type ValueAndGradFunction } from "./autodiff.ts";
export * as utils from "./utils.ts";
export * as optimizers from "./optimizers/index.ts";
