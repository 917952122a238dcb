"""Data parallelism on a real engine (Chapter 14, Section 14.5): DistributedDataParallel over gloo.

Two processes, each holding half of a fixed batch of real trajectories, train a copy of a small
TinyAgent with DistributedDataParallel; the script checks that they end with the gradient and the
weights of one process that trains on the whole batch. The loss of each rank is its sum of token
terms divided by the token count of ALL ranks (an all-reduce of the counts), times the number of
ranks because DDP averages gradients. A second run divides by each rank's own token count (the
per-rank mean) and shows how far that lands when the ranks hold different numbers of tokens.

Usage: torchrun --standalone --nproc_per_node=2 scripts/ddp_check.py [--steps 3] [--lr 0.01]
Rank 0 prints one JSON object on its last stdout line; every number in it is float64.
"""
import argparse
import copy
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch                                         # noqa: E402
import torch.distributed as dist                     # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP   # noqa: E402


def fixed_batch():
    """12 scripted episodes (oracle, blind, random on four train tasks), their advantages, the tokenizer."""
    from agentrl.gym import make_tasks, scripted_policy
    from agentrl.grpo import EditBudgetEnv
    from agentrl.trajectories import build_tokenizer, scripted_rollout
    tok = build_tokenizer(make_tasks('all'))
    tasks = make_tasks('train')[:4]
    trajs = [scripted_rollout(scripted_policy(kind, seed=s), EditBudgetEnv(), task, tok)
             for s, task in enumerate(tasks) for kind in ('oracle', 'blind', 'random')]
    rewards = torch.tensor([t.reward for t in trajs])
    return trajs, rewards - rewards.mean(), tok                       # batch-mean baseline (Chapter 6)


def rank_loss(model, batch, adv, normalise='global'):
    """Token-mean surrogate -A log pi of this rank's rows, normalised so that DDP's average is right.

    normalise='global': (sum of this rank's token terms) / (tokens on every rank) * world size;
    DDP averages the ranks' gradients, which divides by the world size again, so the result is
    the gradient of the whole batch's token mean. normalise='local': this rank's own token mean,
    the per-rank mean that weights every rank equally, however many tokens it holds."""
    from agentrl.policies import sequence_log_probs
    mask = batch['action_mask']                                      # [b, T-1], 1 on policy tokens
    per_token = -adv[:, None] * sequence_log_probs(model, batch['ids'])          # [b, T-1]
    local_sum = torch.where(mask.bool(), per_token, 0.0).sum()
    count = mask.sum()
    if normalise == 'local':
        return local_sum / count
    total = count.clone()
    dist.all_reduce(total)                                           # tokens summed over the ranks
    return local_sum / total * dist.get_world_size()


def train(model, loss_fn, steps, lr):
    "AdamW steps of loss_fn() -> (gradient after the first backward [flat], weights after `steps`)."
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    first = None
    for step in range(steps):
        opt.zero_grad()
        loss_fn().backward()
        if step == 0:
            first = torch.cat([p.grad.flatten() for p in model.parameters()])
        opt.step()
    return first, torch.cat([p.detach().flatten() for p in model.parameters()])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--steps', type=int, default=3)
    ap.add_argument('--lr', type=float, default=0.01)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)
    dist.init_process_group('gloo')
    rank, world = dist.get_rank(), dist.get_world_size()
    from agentrl.policies import TinyAgent, sequence_log_probs
    from agentrl.policy_gradient import aggregate_loss
    from agentrl.trajectories import collate
    trajs, adv, tok = fixed_batch()
    torch.manual_seed(0)
    model = TinyAgent(vocab_size=len(tok), d_model=32, n_layers=2, n_heads=4)

    # one process, the whole batch: the reference
    full = collate(trajs, tok.pad_id)
    ref = copy.deepcopy(model)
    whole = lambda: aggregate_loss(-adv[:, None] * sequence_log_probs(ref, full['ids']), full['action_mask'],
                                   'token_mean')
    ref_grad, ref_weights = train(ref, whole, args.steps, args.lr)

    # world processes, rank r holds the r-th contiguous share of the rows
    rows = torch.arange(len(trajs)).tensor_split(world)[rank].tolist()
    mine = collate([trajs[i] for i in rows], tok.pad_id)
    tokens = torch.tensor([mine['action_mask'].sum()])
    counts = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(counts, tokens)
    report = {'world_size': world, 'steps': args.steps, 'episodes': len(trajs),
              'rows_per_rank': [len(r) for r in torch.arange(len(trajs)).tensor_split(world)],
              'tokens_per_rank': [int(c) for c in counts]}
    for normalise in ('global', 'local'):
        ddp = DDP(copy.deepcopy(model))
        grad, weights = train(ddp, lambda: rank_loss(ddp, mine, adv[rows], normalise), args.steps, args.lr)
        report[normalise] = {'grad_max_abs_diff': float((grad - ref_grad).abs().max()),
                             'grad_rel_diff': float((grad - ref_grad).norm() / ref_grad.norm()),
                             'weights_max_abs_diff': float((weights - ref_weights).abs().max())}
    same = torch.tensor([float(report['global']['weights_max_abs_diff'])])
    dist.all_reduce(same, op=dist.ReduceOp.MAX)                      # the worst rank
    report['global']['weights_max_abs_diff_all_ranks'] = float(same)
    if rank == 0:
        print(json.dumps(report))
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
