"""Nightjar's planner: a contextual bandit choosing gamma per decoding step.

Context = batch-size bucket; arms = gamma values; loss = step latency per generated token.

Exploration follows the paper's hierarchical scheme, per bucket: the steps that fall in a bucket
form blocks of 2^(b-1) steps, each split into bins of about sqrt(block length) steps; a bin is an
exploration bin with probability min(1, explore_scale / sqrt(bin index)); the arm is held fixed for
the whole bin (no thrashing); an exploitation bin plays the arm with the best smoothed mean.

Switching cost: resuming speculation (gamma 0 -> k) makes the engine rebuild the draft's KV cache
(C_switch, reported in ``StepFeedback.switch_cost_s``). It is charged to the decision that changes
speculation on/off, amortised over ``switch_amortise_steps`` steps of the new arm.

Beyond the paper (each switchable for the ablation; ``paper_mode=True`` turns all of them off):
  * ``share_neighbours``: an arm seldom tried in one bucket borrows evidence from the neighbouring
    buckets, rescaled by the loss ratio of an arm both have tried (per-token loss scales with batch);
  * ``eliminate``: exploration bins only play arms whose confidence interval still overlaps the
    best arm's (successive elimination inside the paper's schedule), least-tried first;
  * ``monotone_prior``: the best gamma does not grow with batch size, so exploration in a bucket is
    confined between the best arms of established neighbours on either side;
  * ``hysteresis``: a challenger must beat the arm in use by a relative margin;
  * C_switch is learnt separately from the arms' step losses, as fixed + rate * tokens the draft
    missed while off (least squares over observed switches) plus the bucket's pipeline-fill excess
    (learnt per bucket: it grows with the batch, not with the missed tokens), and charged to the
    decision that flips speculation on/off, amortised over the dwell (exploitation) or the visit (exploration);
    a turn-off's dwell is how long the context stays above the batch where resuming pays (the
    context's own excursions), not only the off-runs of the policy as it stands, which under a
    mostly-on policy are short and priced a profitable turn-off out;
    the paper instead folds it into the loss of the switching step, which makes that arm look
    bad in whichever bucket happened to switch;
  * ``normalise_batch``: the loss is learnt as loss * batch / bucket_lo (per-token loss falls like
    1/batch in the memory-bound regime, which otherwise confounds arms held at different batch sizes
    inside one bucket); ``snapshot``/priors use these normalised units (loss at the bucket's lower
    edge);
  * ``prefill_correction``: the target's work on prompt tokens prefilled in the same step
    (``StepFeedback.prefill_tokens``) costs the same whatever gamma is; its learnt per-token cost
    (from draft-off steps) is subtracted, otherwise arms that emit more tokens look better merely by
    amortising someone else's prefill. The running draft's own prefill stays in the gamma > 0 loss;
  * ``amortise_draft_prefill``: how the draft's prefill is charged. A prompt is prefilled in one
    step, so with the draft on that step carries the draft's prefill of every prompt admitted (on the
    Qwen CPU pair a 260-token wave is a 7 s step, 2 s more with the draft on), and the lump would land
    in whichever arm that step's bin played. Instead each step's own state's prefill slope (draft
    off / on) is taken out, and every gamma > 0 arm is charged the draft's learnt extra seconds per
    prompt token times the workload's prompt tokens per generated token (pooled over all steps):
    the long-run price of keeping the draft on, which a decode-only estimate misses (on the Qwen CPU
    trace it is most of what static speculation lost to no-SD). Until both states have seen prompts,
    the priors' slope stands in, else the catch-up line's per-token rate. ``snapshot`` exports the
    decode-only losses and the slope: priors are per pair and device, the prompt/output ratio is
    each worker's own workload;
  * ``step_prefill_price``: the mean price chooses a bucket's arm; the step at which to turn the
    draft off is chosen at the step's own prompt tokens (``decide``'s ``prompt_tokens``), which
    staying on would have the draft prefill now (``Estimator.priced_at_step``): when the held arm would turn
    it off, and when a held gamma > 0 arm ties with gamma 0 (``_tie_at_prompt_step``);
  * acceptance gate (``min_acceptance``): acceptance is a property of the draft and the content, not
    of the batch size, so it is pooled over all buckets; once its upper confidence bound is below
    ``min_acceptance`` no bucket plays gamma > 0, exploring or exploiting (a draft that is almost
    never accepted cannot pay, whatever the batch). The pooled counts decay
    (``acceptance_halflife_steps``), so the gate re-opens now and then and a change of content is
    noticed.

Evidence is discounted per observation (``discount``) so the planner tracks drifting acceptance.

The parts, one file each: ``cells`` (per bucket x arm statistics), ``estimates`` (means with
priors, neighbours and prefill corrections), ``prefill``, ``switching`` (C_switch), ``excursions``,
``flips`` (pricing a flip), ``gate`` (acceptance), ``schedule`` (blocks and bins), ``explore``
(what an exploration bin plays), ``priors`` (loading and reconciliation); ``bandit`` composes them
(``NightjarPolicy``).

Step contract: see ``planner/policy.py``. ``decide`` is O(1) on the common path (inside a bin).
"""

from nightjar_worker.planner.nightjar.bandit import NightjarPolicy

__all__ = ["NightjarPolicy"]
