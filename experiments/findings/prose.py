"""What the rows of ``seed_findings.md`` say in words ("In words", "Against the issue"), every measured figure
filled in from the result files (:mod:`~experiments.findings.facts_runs`, :mod:`~experiments.findings.facts_arms`,
:mod:`~experiments.findings.facts_tables`): re-made results re-make the sentences. A paragraph whose result files
are not on this machine is left out. The wording is the authors'; a verdict word in it (reproduced, inconclusive)
is the one the paragraph's row computes."""

from __future__ import annotations

from collections.abc import Callable

from experiments.findings.membership import paragraph as _membership


def _switch_full(f: dict) -> str:
    return (
        f"* **Switch point at full size (`gpu_full`, {f['gf_seeds']} seeds, non-DP {f['gf_nondp']} %).** At equal ε "
        f"and equal total steps, more public steps before DP help all the way to the grid's end: {f['gf_sw0']} % with "
        f"none, {f['gf_sw_rest']} % after {f['gf_sw_rest_steps']} public steps ({f['gf_top']} vs 0: Welch, Holm over "
        f"{f['gf_n_k']}, {f['gf_p_top']}; {f['gf_d_top']} points {f['gf_top_every']}). {f['gf_first']} steps sit "
        f"{f['gf_d_first']} points *{f['gf_first_dir']}* none (paired by seed, Holm {f['gf_p_first']}, descriptive). "
        "The public images here are in-distribution CIFAR-10, so a public step is nearly a non-DP step, and the "
        f"issue's grid stops before the curve turns: the best switch point is at or beyond {f['gf_top']} of "
        f"{f['gf_steps']}. The non-DP run's tr(H) on 256 held-out images rises from its (negative, indefinite) value "
        f"at initialisation to its highest point at step {f['gf_peak']} ({f['gf_tr_peak']}) and is {f['gf_tr_last']} "
        f"at step {f['gf_last']}. That fall is within the noise once the test allows for the peak being picked among "
        f"the grid's {f['gf_n_interior']} interior points (one-sided Welch, Bonferroni × {f['gf_n_interior_num']}); "
        "the uncorrected two-standard-error rule this table used before called it a fall (`tests/test_seed_findings.py` "
        "checks that the corrected rule calls a fall on at most 5 % of 1,000 flat, noisy 16-point curves).")


def _decelerator_full(f: dict) -> str:
    return (
        f"* **Our decelerator threshold rule at full size (`gpu_full`, {f['gf_seeds']} seeds): not reproduced, as a "
        "rule of ours.** The paper switches by early stopping on validation loss; the threshold rule is ours "
        "(`training/recipes/switch.py`, `continual_pretrain.yaml`): it "
        f"switches to DP once σ²·tr(H)/(B·c²) falls below {f['gf_dec_threshold']}, with tr(H) estimated every "
        f"{f['gf_dec_every']} public steps on 256 public images (32 probes) and the σ the remaining steps would get. "
        f"It fired {f['gf_dec_first_check']}: after {f['gf_dec_at']} public steps, at a decelerator of "
        f"{f['gf_dec_value']} (tr(H) {f['gf_dec_trace']}). Those runs reach {f['gf_dec_acc']} %, as the sweep's "
        f"{f['gf_dec_at']}-step point does ({f['gf_sw_at_rule']} %), below DP from scratch ({f['gf_sw0_ms']} %, Welch "
        f"{f['gf_dec_p0']}) and {f['gf_dec_best_gap']} points below the sweep's best, {f['gf_best']} public steps "
        f"({f['gf_best_acc']} %; Welch, Bonferroni × {f['gf_n_sweep']} for picking the best, {f['gf_dec_p_best']}). "
        "The rule reads the decelerator as if it started high and fell (the paper's picture: DP noise hurts most "
        f"early, where tr(H) is large). Here tr(H) starts negative and is still small and rising at step "
        f"{f['gf_dec_at']}, so a level threshold fires at once, at the sweep's worst point. The non-DP run's "
        f"curvature is highest only at step {f['gf_peak']}, and the sweep still gains at {f['gf_top']}: a rule that "
        "waited for the peak would not be contradicted by these runs, but that is not the rule the paper states, and "
        f"we did not run it. Under DP the held-out tr(H) keeps rising ({f['gf_dec_tr_last']} at step {f['gf_last']} "
        f"against {f['gf_tr_last']} non-DP), so the decelerator grows from {f['gf_dcel_first']} to "
        f"{f['gf_dcel_last']} over the DP phase. At `cpu_hour` the same rule {f['ch_dec_fired']} (below); at `gpu` "
        f"({f['g_nondp_seeds']} seeds, read off the non-DP run's tr(H), no run) it would have switched "
        f"{f['g_dec_switch']} while the best was at {f['g_best']}. Fixed switches at this scale favour the paper: "
        f"{f['gf_d_top']} points after {f['gf_top']} public steps (the sweep), and the continual arm's "
        f"{f['ca_switch']}-step run {f['ca_cont']} % against {f['ca_scratch']} % from scratch (two-sided Welch "
        f"{f['ca_p_cont']}; its own row). The paper's validation-loss switch is our plateau rule: capped at "
        f"{f['ca_plateau_cap']} public steps, it never fired (below), so at this scale that switch is untested.")


def _switch_gpu(f: dict) -> str:
    return (
        f"* **Switch point (`gpu`, {f['g_images']} images, {f['g_seeds']} seeds).** At equal ε and equal total steps, "
        f"{f['g_best']} public steps before DP give the best mean ({f['g_best_acc']} % vs {f['g_sw0']} % with none), "
        f"and the curve falls again at {f['g_after']} ({f['g_after_acc']}): public steps help up to a point, then eat "
        "the DP budget's steps. With the pre-set Welch test and Holm over the "
        f"{f['g_n_k']} switch points this is not significant ({f['g_p_best']}); paired by seed (one initialisation "
        f"per seed in every arm) the {f['g_d_best']} points at {f['g_best']} steps are {f['g_best_every']} (Holm "
        f"{f['g_p_paired']}), which we report as descriptive only.")


def _continual_cpu_hour(f: dict) -> str:
    return (
        "* **Continual pre-training (`cpu_hour`, 5 seeds, the configs).** At equal ε and total steps, "
        f"{f['ch_switch']} public steps then {f['ch_dp_steps']} DP steps beat {f['ch_steps']} DP steps from scratch "
        f"({f['ch_cont']} % vs {f['ch_scratch']} %, Holm {f['ch_p_cont']}), and the small CNN's sweep rises to its "
        f"largest point ({f['ch_top']} of {f['ch_steps']} public steps: {f['ch_top_acc']} %, Holm {f['ch_p_top']}); "
        f"the GPU sweep's hump (best at {f['g_best']} of 1,000, falling after) is what a model that learns from its DP "
        "steps shows, the small CNN is not there.")


def _continual_arm(f: dict) -> str:
    mia = ("; at `cpu_hour` they were (the membership arm, below)" if "mi_verdict" in f else "")
    plateau = ("The plateau rule never fired: the public validation loss still fell at its cap of "
               f"{f['ca_plateau_cap']} steps, so its row is inconclusive, as at `cpu_hour`." if f["ca_plateau_capped"]
               else f"The plateau rule fired (at up to {f['ca_plateau_cap']} steps).")
    return (
        "* **Noise, the plateau rule and membership at full size (`gpu_full`, the continual arm, 5 seeds).** Noise "
        f"carries most of the DP loss, clipping the rest: clipping alone (σ = 0) costs {f['ca_clip_cost']} points "
        f"against non-DP ({f['ca_clip']} % vs {f['ca_nondp']} %, 95 % CI {f['ca_ci']}, two-sided Welch "
        f"{f['ca_p_clip']}), more than the {f['ca_margin']}-point margin within which we would call the two the same (a "
        "margin set after the cost was known; the row's 90 % interval gives the verdict for any other) "
        f"(TOST: 'clipping alone ≈ non-DP' {f['ca_clip_eq']}), the noise a further {f['ca_noise_cost']} (DP from "
        f"scratch {f['ca_scratch']} %, {f['ca_p_noise']}). The arm's continual run "
        f"({f['ca_switch']} public steps, then {f['ca_dp_steps']} DP steps) reaches {f['ca_cont']} % and the plateau "
        f"rule's run {f['ca_plateau']} %: the configs' sweep at {f['ca_switch']} and {f['ca_plateau_cap']} public "
        f"steps gave {f['gf_at_arm_switch']} % and {f['gf_at_arm_cap']} % through a separate code path. {plateau} The "
        f"LOSS attack's AUC is {f['ca_auc_dp']} on every DP checkpoint against {f['ca_auc_nondp']} for non-DP "
        f"({f['ca_p_auc']}), and its TPR at 1 % FPR is {f['ca_tpr_dp']} %, chance, as it is on the non-DP model "
        f"({f['ca_tpr_nondp']} %): this attack could not have detected a leak at low FPR, so the membership row is "
        "inconclusive. The suite's strongest attacks (LiRA, RMIA) were not run on these models (see Untested)"
        f"{mia}. To "
        f"the LOSS attack the clipping-only model leaks as much as the non-DP one (AUC {f['ca_auc_clip']}, TPR "
        f"{f['ca_tpr_clip']} %). The same three rows at `cpu_hour` (small CNN) agreed: clip-only {f['cas_clip']} % vs DP "
        f"{f['cas_scratch']} %, AUC {f['cas_auc_dp']} vs {f['cas_auc_nondp']}.")


def _ganesh(f: dict) -> str:
    return (
        f"* **Ganesh et al. at full size (`gpu_full`, ResNet-20, 5 seeds; public steps on {f['ga_public']} CIFAR-10 "
        f"images, then {f['ga_steps']} DP steps of batch {f['ga_batch']} on {f['ga_private']} others at ε = 8, σ = "
        f"{f['ga_sigma']}; {f['ga_test']} test images): both rows reproduced as stated, the barrier row without its "
        f"control at this scale.** DP accuracy after "
        f"{f['ga_budgets']} public steps is {f['ga_accs']} %: flat up to {f['ga_flat_to']} public steps "
        f"({f['ga_flat']} buy nothing over none), then {f['ga_d_mid']} points at {f['ga_mid']} and +{f['ga_d_top']} "
        f"at {f['ga_top']} ({f['ga_p_top']}). Between two DP runs from one public init ({f['ga_top']} steps) the "
        f"private training loss rises by {f['ga_same']} along the straight line, ~{f['ga_same_pct']} % of the end "
        f"points' {f['ga_ends_same']}; between two from random inits by {f['ga_rand']} ({f['ga_rand_span']}), "
        f"~{f['ga_rand_pct']} % of their {f['ga_ends_rand']} ({f['ga_p_barrier']}). So the runs from one public init "
        "are not barrier-free here (at `cpu_hour`, the small CNN, they were: "
        f"{f['gas_same']} vs {f['gas_rand']}), but they sit in one basin next to what random inits give. Two "
        "different random inits are apart by permutation symmetry alone, so this comparison cannot credit the public "
        "data; the shared-random-init control ran at `cpu_hour` only (below). "
        f"{f['ga_parts']} parts, {f['ga_parts_cpu']} on this CPU (bk, one thread, {f['ga_cpu_secs']} s each, two or "
        f"three side by side) and {f['ga_parts_gpu']} on an H100 lease (the JSON's `mixed_machines`); "
        f"{f['ga_hours']} hours of training in all.")


def _trace(f: dict) -> str:
    return (
        f"* **tr(H) at full size (`gpu_full`, ResNet-20, 5 seeds; {f['tr_batch']} held-out test images, "
        f"{f['tr_probes']} probes, every {f['tr_every']} of {f['tr_steps']} steps; σ = {f['tr_sigma']} at ε = 8).** "
        f"Non-DP pre-training ({f['tr_nd_acc']} % at the end) reaches its level by step {f['tr_first']} "
        f"({f['tr_nd_first']}, from about {f['tr_nd_init']} at initialisation) and stays near {f['tr_nd_level']} "
        f"(highest {f['tr_nd_peak']} at step {f['tr_nd_peak_step']}, {f['tr_nd_last']} at step {f['tr_last_step']}): "
        f"no fall that survives the peak-picking correction. DP pre-training ({f['tr_dp_acc']} %) keeps rising, from "
        f"{f['tr_dp_first']} at step {f['tr_first']} to {f['tr_dp_last']} at step {f['tr_last_step']} (two-sided "
        f"Welch {f['tr_p_rise_dp_raw']}, Bonferroni × 2 for the two curves {f['tr_p_rise_dp']}) with no fall from its "
        f"highest point that survives the correction: for DP pre-training the claim is {f['tr_v_dp']} within these "
        f"{f['tr_steps']} steps (a later peak is not ruled out); for non-DP it is {f['tr_v_nd']} (rise "
        f"{f['tr_p_rise_nd']}). DP fine-tuning from each seed's "
        f"{f['tr_source_steps']}-step non-DP public model ({f['tr_ft_acc']} % at the end) starts at that model's "
        f"{f['tr_ft_start']} and falls to {f['tr_ft_last']}. Over the run its mean is not smaller than DP "
        f"pre-training's ({f['tr_mean_ft']} vs {f['tr_mean_dp']}, Welch {f['tr_p']}: inconclusive); at the last step "
        f"it is ({f['tr_end_ft']} vs {f['tr_end_dp']}, descriptive only): fine-tuning starts sharp and flattens, "
        "pre-training starts flat and sharpens, and the pre-set mean over the run averages the two trends away. DP "
        f"steps by bk, except {f['tr_hooks']}'s pre-training (Opacus hooks; the same clipped sums).")


def _trace_small(f: dict) -> str:
    return (
        "* **Against the paper at `cpu_hour`:** tr(H) on held-out images is *larger* in DP fine-tuning from a public "
        f"model than in DP pre-training from scratch ({f['trs_ft']} vs {f['trs_dp']} over the run, {f['trs_p']}). "
        "Bu et al.'s argument compares trained states; our fine-tuning starts from a model "
        f"{f['trs_source_steps']} non-DP steps into training, which sits in a sharper region than a random "
        "initialisation, and the small CNN is far from their models.")


def _not_exercised(f: dict) -> str:
    return (
        "* **Not exercised:** neither switch rule fired at `cpu_hour`. The decelerator σ²·tr(H)/(B·c²) stayed above "
        "its threshold and the public validation loss kept improving, so both arms switched at their cap "
        f"({f['ch_cap']} public steps): their rows say only that more public steps helped, and whether the rule "
        f"picks the sweep's best point is untested. At `gpu_full` the plateau rule again ran to its cap "
        f"({f['ca_plateau_cap']} public steps); the decelerator rule fired, too early (above).")


def _plateau_room(f: dict) -> str:
    fired = (f"It fired on {f['cp_fired']} seeds (switching at {f['cp_switch']} public steps)" if f["cp_fired_n"]
             else f"It never fired (every seed switched at the cap, {f['cp_switch']})")
    return (
        f"* **The paper's switch with room to fire (`cpu_hour`, the small CNN, 5 seeds).** The plateau rule, our "
        f"implementation of early stopping on the public validation loss, ran again with its cap raised from "
        f"{f['cp_capped_cap']} to {f['cp_cap']} of {f['cp_steps']} steps (`cpu_hour_plateau`). {fired}, reaching "
        f"{f['cp_acc']} % against DP from scratch's {f['cp_scratch']} % on the same seeds (two-sided Welch "
        f"{f['cp_p']}; {f['cp_verdict']}) and the capped rule's {f['cp_capped']} %. At `gpu_full` it stays untested "
        "(Untested).")


_PROSE: tuple[Callable[[dict], str], ...] = (_switch_full, _decelerator_full, _switch_gpu, _continual_cpu_hour,
                                             _continual_arm, _membership, _ganesh, _trace, _trace_small,
                                             _not_exercised, _plateau_room)


def paragraphs(f: dict, makers: tuple[Callable[[dict], str], ...]) -> list[str]:
    """Each paragraph whose figures are all in ``f`` (a missing one leaves its paragraph out)."""
    out = []
    for make in makers:
        try:
            out.append(make(f))
        except KeyError:
            continue
    return out
