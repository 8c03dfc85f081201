"""llmk.patch on a model that transformers loaded tensor-parallel (``DistributedConfig(tp_plan="auto")``) over two
processes on the CPU (gloo): every rank's logits and greedy generation (a ragged, left-padded
batch) against the same TP model unpatched, with the default patch and with ``decode=True``
(whose KV cache holds the rank's share of the kv heads); every decoder layer's two all-reduces
run through llmk.distributed.all_reduce_add_rmsnorm (its NCCL/gloo path here), and unpatch
gives the plan's forwards back. A training step (float32) of the patched TP model against the
unpatched one: the loss and a row-parallel weight's gradient shard; the patched TP model under
torch.compile (Dynamo and AOTAutograd, graph breaks allowed) against the unpatched logits."""

import gc
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

from ranks import run_ranks

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="transformers loads tensor-parallel models through accelerate")
from hf_models import assert_generation_follows, greedy, perturb_norms  # noqa: E402 (needs transformers)

WORLD = 2
TINY = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, vocab_size=512)
TOLERANCE = 4e-2  # test_patch's: bf16 logits of two models that round differently
TP_FUSED = "tensor-parallel all-reduce + residual add + rmsnorm (decoder layers)"


def _save_model(path):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).to(torch.bfloat16)
    perturb_norms(model)
    model.save_pretrained(path)


def _rank(rank, rendezvous, failures, model_path, backend):
    import faulthandler

    import llmk

    faulthandler.dump_traceback_later(240, exit=True)  # a rank stuck in a collective says where
    # transformers reads the world from torchrun's variables
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    try:
        model = transformers.LlamaForCausalLM.from_pretrained(
            model_path, distributed_config=transformers.DistributedConfig(tp_plan="auto"), dtype=torch.bfloat16).eval()
        assert hasattr(model.model.layers[0].self_attn.k_proj.weight, "to_local"), "the model did not load sharded"
        device = next(model.parameters()).device  # gloo: the CPU, or a GPU where there is one
        assert backend != "nccl" or device.type == "cuda", device
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(1, TINY["vocab_size"], (2, 19), generator=g).to(device)
        mask = torch.ones_like(ids)
        ids[1, :5], mask[1, :5] = 0, 0
        with torch.no_grad():
            want_logits = model(ids[:1]).logits.float()
        want = greedy(model, ids, mask, 8)
        report = llmk.patch(model, linear=True)
        assert "tensor-parallel forward" in report.left["linear"], report
        llmk.unpatch(model)
        for options in ({}, {"decode": True}):
            report = llmk.patch(model, **options)
            try:
                assert report.replaced[TP_FUSED] == TINY["num_hidden_layers"], report
                with torch.no_grad():
                    got_logits = model(ids[:1]).logits.float()
                err = ((got_logits - want_logits).abs().max() / want_logits.abs().max()).item()
                assert err <= TOLERANCE, f"{options}: logits off by {err:.3g}"
                assert_generation_follows(greedy(model, ids, mask, 8), want, TOLERANCE, f"rank {rank} {options}")
                if options:  # (no local name for the cache: its CUDA graph must go with the model)
                    assert model._llmk_patch["decode"].cache.heads_kv == TINY["num_key_value_heads"] // WORLD
            finally:
                llmk.unpatch(model)
        with torch.no_grad():
            again = model(ids[:1]).logits.float()
        assert torch.equal(again, want_logits), "unpatch did not restore the TP model"
    except Exception as e:  # noqa: BLE001 - the parent reports each rank's failure
        failures.put(f"rank {rank}: {type(e).__name__}: {e}")
    finally:
        # the decode step's CUDA graphs (which hold NCCL work) and the peer buffers go before the
        # process group: with them alive the NCCL ranks hung in destroy_process_group
        model = None  # noqa: F841 (its graphs go with it)
        gc.collect()
        if backend == "nccl":
            torch.cuda.synchronize()
            llmk.distributed.release_peer_groups()
        dist.destroy_process_group()


def test_patch_on_a_tensor_parallel_model_over_gloo(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the CPU processes of CI, on any machine
    with tempfile.TemporaryDirectory() as tmp:
        model_path = os.path.join(tmp, "model")
        _save_model(model_path)
        run_ranks(_rank, WORLD, model_path, "gloo")


def test_patch_on_a_tensor_parallel_model_over_nccl(monkeypatch):
    """The same on two GPUs: the layers' all-reduces on llmk's fused kernel (decode-sized
    messages) and NCCL + add_rmsnorm_ (the prompt's)."""
    if torch.cuda.device_count() < WORLD:
        pytest.skip(f"{WORLD} GPUs needed, {torch.cuda.device_count()} present")
    for k, v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
        monkeypatch.setenv(k, v)
    with tempfile.TemporaryDirectory() as tmp:
        model_path = os.path.join(tmp, "model")
        _save_model(model_path)
        run_ranks(_rank, WORLD, model_path, "nccl")


def _train_and_compile_rank(rank, rendezvous, failures, model_path):
    import llmk

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD))
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD)
    try:
        model = transformers.LlamaForCausalLM.from_pretrained(
            model_path, distributed_config=transformers.DistributedConfig(tp_plan="auto"), dtype=torch.float32)
        ids = torch.randint(1, TINY["vocab_size"], (2, 17), generator=torch.Generator().manual_seed(3))

        def step():
            model.zero_grad()
            out = model(ids, labels=ids)
            out.loss.backward()
            grad = model.model.layers[0].self_attn.o_proj.weight.grad
            return out.loss.item(), (grad.to_local() if hasattr(grad, "to_local") else grad).clone()

        want_loss, want_grad = step()
        with torch.no_grad():
            want_logits = model(ids).logits
        llmk.patch(model)
        got_loss, got_grad = step()
        assert abs(got_loss - want_loss) <= 1e-5 * abs(want_loss), (got_loss, want_loss)
        err = ((got_grad - want_grad).abs().max() / want_grad.abs().max()).item()
        assert err <= 1e-5, f"rank {rank}: o_proj's gradient shard off by {err:.3g}"
        with torch.no_grad():
            compiled = torch.compile(model, backend="aot_eager")(ids).logits
        err = ((compiled - want_logits).abs().max() / want_logits.abs().max()).item()
        assert err <= 1e-5, f"rank {rank}: the compiled patched model's logits off by {err:.3g}"
    except Exception as e:  # noqa: BLE001 - the parent reports each rank's failure
        failures.put(f"rank {rank}: {type(e).__name__}: {e}")
    finally:
        dist.destroy_process_group()


def test_training_and_compile_on_a_tensor_parallel_model_over_gloo(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with tempfile.TemporaryDirectory() as tmp:
        model_path = os.path.join(tmp, "model")
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).save_pretrained(model_path)
        run_ranks(_train_and_compile_rank, WORLD, model_path)
