"""The findings' words on the representation law, Ke et al.'s budget split and arm, and how the whole stands against
the issue, every measured figure filled in from the result files (as :mod:`~experiments.findings.prose`)."""

from __future__ import annotations

from collections.abc import Callable


def _law(f: dict) -> str:
    return (
        f"* **Representation law (`gpu_full_vit_long`: ViT-Tiny's width, {f['v_blocks']} blocks, one model "
        f"pre-trained to {f['v_pre']} %, {f['v_seeds']} seeds).** DP fine-tuning on the {f['v_private']} private "
        f"images lifts it by about {f['v_lift']} points at every ε (untuned: {f['v_unt1']} % at ε = 1, "
        f"{f['v_unt3']} % at 3, {f['v_unt8']} % at 8, {f['v_untinf']} % non-DP): from this start the noise costs "
        "nothing we can measure. Neither per-block law clears the pre-set bar (the 95 % interval of the mean R² "
        "against 0.9). The prediction residual falls fast over the first three blocks and slowly after (ε = 1: "
        f"{f['v_res1_head']}, then {f['v_res1_tail']} over blocks 4-{f['v_blocks']}; ρ ≈ {f['v_rho_res']}): R² "
        f"{f['v_r2_res']}, below the bar at ε = {f['v_res_below']} and within reach of it only at ε = "
        f"{f['v_res_reach']}, so the all-ε row is inconclusive and leans against a geometric decay. The pre-trained "
        f"model has the same two-speed profile before any fine-tuning ({f['v_pre_res']}). Fuzziness D decays at ρ ≈ "
        f"{f['v_rho_d']} with R² {f['v_r2_d']}: inconclusive at every ε; its last block turns up again in the "
        f"pre-trained model ({f['v_pre_d_turn']}) and under DP ({f['v_d1_turn']} at ε = 1), not after non-DP "
        "fine-tuning. The R² bar of 0.9 is ours (the paper states none): it decides only whether a law is "
        "geometric, not whether the laws agree across ε. The paper says they are near-identical across ε, a claim of "
        "sameness, so it is tested for equivalence (TOST: each DP ε's ρ against non-DP's, margin ±20 % of the "
        "non-DP per-block decay 1 − ρ, set after earlier tables had shown the ρ's, so the rows print the 90 % "
        f"intervals for any other margin): the residual's ρ is equivalent at every ε (margin ±{f['v_margin_res']}; "
        f"{f['v_eq_res']}), even though that law is not geometric by our bar; D's is not shown equivalent (ρ "
        f"{f['v_rho1']} at ε = 1 vs {f['v_rhoinf']} non-DP; margin ±{f['v_margin_D']}, 90 % CI of the difference "
        f"{f['v_eq_D_ci1']}; {f['v_eq_D']}). The public learning-rate search makes "
        f"neither the law hold better (Holm {f['v_p_tune_law']}) nor the model better (ε = 1: {f['v_tuned1']} % tuned "
        f"vs {f['v_unt1']} % untuned; Holm {f['v_p_tune_acc']}). The narrower ViT on this CPU (`cpu_vit_long`, width "
        f"{f['vn_width']}, pre-trained to {f['cvl_pre']} % on its 1,000 test images) agreed on D (R² {f['vn_r2_d']}) "
        f"and on tuning, but there the residual law held (R² {f['vn_r2_res']} at every ε, ρ ≈ {f['vn_rho_res']}: "
        "reproduced). At about the same accuracy the two widths disagree on the residual, so we call that claim "
        f"inconclusive, not reproduced. ViT-Tiny's width pre-trained only to {f['vs_pre']} % (`gpu_full_vit`) showed "
        f"the residual barely falling (ρ ≈ {f['vs_rho_res']}, R² ≈ {f['vs_r2_res']}). That the DP noise reaches the "
        "weights is checked, on a tiny ViT, by `tests/test_seed_arm_vit.py` (σ = 3 moves the weights about as far as "
        "clipping alone, within a factor of 3, in a direction with |cosine| < 0.3 to clipping's); it was not "
        "measured on this arm's models.")


def _budget_split(f: dict) -> str:
    if "bs_ref_lp" in f:
        limits = (
            f"One limit: the {f['bs_runs']} per-seed DP runs at `gpu_full` are not archived (their tests use the "
            "committed table's rounded mean ± SD). What DP costs here is measured since: the same source fine-tuned "
            f"without DP (same data, steps and learning rates) reaches {f['bs_ref_lp']} by LP and {f['bs_ref_fft']} "
            f"by FFT, so at ε = 8 DP costs LP {f['bs_cost_lp8']} points (DP-LP's {f['bs_lp8']} %) and FFT "
            f"{f['bs_cost_fft8']} ({f['bs_fft8']} %).")
    else:
        limits = (
            f"Two limits: the {f['bs_runs']} per-seed runs at `gpu_full` are not archived (their tests use the "
            "committed table's rounded mean ± SD), and "
            + (f"{f['bs_ref_partial']}, so what DP costs here is measured for that one only" if "bs_ref_partial" in f
               else "no non-DP fine-tuning of either source on this task was run, so what DP costs here (DP-LP's "
                    f"{f['bs_lp8']} % from a {f['bs_source']} % source) has no reference") + ".")
    return (
        f"* **Ke et al.'s budget split at full size (`gpu_full`: a {f['bs_source']} % ResNet-20 source, "
        f"{f['bs_steps']} DP steps on the Food-101 slice, {f['bs_seeds']} seeds).** LP-FFT beats DP-LP at ε = 8 by "
        f"{f['bs_lp8_gap']} points ({f['bs_lpfft8']} % vs {f['bs_lp8']} %, Holm {f['bs_p_lp8']}): with a real source "
        f"the backbone gains from DP updates. At ε = 1 LP-FFT leads LP by {f['bs_lp1_gap']} points (Holm "
        f"{f['bs_p_lp1']}) and FFT by {f['bs_fft1_gap']} points: inconclusive. LP first does not measurably help "
        f"against FFT at either ε (ε = 8: {f['bs_fft8_gap']} points, Holm {f['bs_p_fft8']}). FFT moves the backbone "
        f"as far at ε = 1 as at ε = 8 ({f['bs_drift']}): DP-AdamW normalises each update. At `cpu_hour` (the small "
        f"CNN, a {f['bss_source']} % source) the picture was the other way round: LP-FFT beat FFT (ε = 1: Holm "
        f"{f['bss_p_fft1']}) but not LP, which was better at ε = 1. So which baseline LP-FFT beats depends on the "
        f"source: against LP once the source is good, against FFT when it is weak. {limits}")


def _ke_arm(f: dict) -> str:
    return (
        "* **Ke et al.'s arm on a source past 60 % (`cpu_vit_ke`, 5 seeds).** From `cpu_vit_long`'s pre-trained ViT "
        f"({f['cvl_pre']} % on its 1,000 CIFAR-10 test images) to the 10-class Food-101 slice at ε = 8: LP-FFT with "
        "its split chosen on "
        f"held-out validation images beats DP linear probing alone ({f['ke_sel']} % vs {f['ke_lp']} %, "
        f"{f['ke_p_lp']}), so the backbone gains from DP updates here, which the small CNN's table did not show. But "
        f"LP first buys nothing over full fine-tuning from a random head ({f['ke_random']} %), nor does an LP-aligned "
        f"head at equal backbone steps ({f['ke_aligned']} %; a zero head {f['ke_zero']} %), and the features do not "
        f"tell the heads apart either: every arm lifts the backbone's kNN quality from {f['ke_knn_start']} % to "
        f"{f['ke_knn_end']} % (LP-aligned {f['ke_knn_aligned']} %, random {f['ke_knn_random']} %). The validation "
        f"picked the smallest LP share ({f['ke_sel_share']} % of ε) {f['ke_sel_every']}, and the LP-aligned arm's "
        "FFT phase runs on half of ε, so at equal total ε the extra noise in its backbone steps may cost what the "
        "aligned head saves (we did not separate the two). The claim stays inconclusive here, not refuted. At "
        f"`cpu_hour` (the small CNN) the same arm was within the noise too (LP-aligned {f['kes_aligned']} % vs random "
        f"{f['kes_random']} %).")


def _against_issue(f: dict) -> str:
    mia = (f" The membership claim is tested with the suite's strongest attack (LiRA / RMIA, {f['mi_models']} models "
           f"per training at `cpu_hour`): {f['mi_verdict']}; at `gpu_full` only LOSS / Attack-P ran, which could not "
           "have found a leak at low FPR." if "mi_verdict" in f else "")
    return (
        "**Against the issue.** Every group of claims has now run at a scale whose non-DP baseline is past 60 %: the "
        f"`gpu_full` continual config ({f['gf_nondp']} %), the continual arm ({f['ca_nondp_mean']} %), the tr(H) arm "
        f"({f['tr_nd_acc']} %), Ganesh et al. (all {f['ga_parts']} parts), Ke et al.'s budget-split table (a "
        f"{f['bs_source']} % source, all {f['bs_runs']} runs on this CPU), the Ke et al. arm (`cpu_vit_ke`, the "
        f"{f['cvl_pre']} % ViT) and the 12-block ViT at ViT-Tiny's width (`gpu_full_vit_long`, {f['v_pre']} %). "
        "Inconclusive rows stay inconclusive: the tests did not separate the arms. Since issue 36 the verdicts are "
        "two-sided and claims of sameness are tested for equivalence, so a row can now say 'not reproduced' when the "
        f"data point the other way (the DP tr(H) curve, clipping's own cost, our decelerator threshold).{mia} The "
        "geometric "
        "law on the 3-block "
        "CNN (`transfer.md`) is inconclusive as well: 3 points per fit leave 1 residual degree of freedom. "
        "`results/reference/seed_gpu/LEASES.md` has every lease as it ran and what each arm cost.")


def _ganesh_control(f: dict) -> str:
    return (
        f"* **Ganesh et al.'s control (`{f['gc_scale']}`, the small CNN, {f['gc_seeds']} seeds).** Two different random "
        "inits are apart by permutation symmetry alone, so a barrier between them says nothing about public data. "
        "The control trains two DP runs from one shared *random* init (other batches and noise): their barrier is "
        f"{f['gc_same_random']}, against {f['gc_same']} from one public init and {f['gc_rand']} from two random "
        f"inits (same random vs same public: two-sided Welch {f['gc_p']}; {f['gc_verdict']}). {f['gc_reading']} "
        "Whether public data does more than a shared start at `gpu_full` is untested (the control's command there is "
        "under Untested).")


def _ganesh_contrast(f: dict) -> str:
    return (
        f"* **Ganesh et al.'s private-vs-non-private contrast (`{f['gx_scale']}`, the small CNN, {f['gx_seeds']} "
        f"seeds).** {f['gx_top']} public steps lift DP training from {f['gx_dp0']} % to {f['gx_dpt']} % "
        f"({f['gx_gain_dp']} points) and the same private steps without DP from {f['gx_nd0']} % to {f['gx_ndt']} % "
        f"({f['gx_gain_nd']} points); that public pre-training buys DP training more: two-sided Welch on the "
        f"per-seed gains {f['gx_p']}, {f['gx_verdict']}. At `gpu_full` the contrast is untested (Untested).")


PROSE: tuple[Callable[[dict], str], ...] = (_ganesh_control, _ganesh_contrast, _law, _budget_split, _ke_arm)
CLOSING: tuple[Callable[[dict], str], ...] = (_against_issue,)
