// @mlx-bun/mlx/optimizers: mlx.optimizers (optimizers.py, schedulers.py).
export * from "./optimizers.ts";
export * from "./schedulers.ts";
