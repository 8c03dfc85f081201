"""The fused AdamW step (the optimizer class is llmk.optim.AdamW).
C++ kernel: python/src/ops_optim.cc over include/llmk/optim.h."""

from ._table import define

define("adamw_step_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
       "Tensor[] steps, float lr, Tensor? lr_tensor, float beta1, float beta2, float eps, float weight_decay, "
       "bool maximize) -> ()",
       lambda *args: None, public=False)
