// llmk: fused GPU kernels for transformer language models. Umbrella header.
#pragma once

#include "llmk/activation.h"
#include "llmk/all_reduce.h"
#include "llmk/attention.h"
#include "llmk/attention_decode.h"
#include "llmk/device_info.h"
#include "llmk/dtype.h"
#include "llmk/error.h"
#include "llmk/gemm.h"
#include "llmk/loss.h"
#include "llmk/norm.h"
#include "llmk/optim.h"
#include "llmk/quantized_gemm.h"
#include "llmk/rope.h"
#include "llmk/softmax.h"
#include "llmk/tensor.h"
