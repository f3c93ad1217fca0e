"""The report's provenance section: where the run came from, and whether the audit ran code the run names.

Pure functions of the parsed files (:class:`audit.reporting.inputs.RunFiles`), like the other sections of
:mod:`audit.reporting.build`.
"""

from __future__ import annotations

from typing import Any

from audit.reporting import fmt
from audit.reporting.inputs import RunFiles
from audit.reporting.model import ProvenanceSection
from training.trust import code_in_run

__all__ = ["provenance_section", "code_items"]


def provenance_section(run: RunFiles, commands: dict[str, str]) -> ProvenanceSection:
    man = run.manifest
    pv, md, dt = man.provenance, man.model, man.data
    items: list[tuple[str, Any]] = [
        ("run", man.run_name), ("created", pv.created), ("dp-audit version", pv.package_version),
        ("git commit", None if pv.git_commit is None else
         pv.git_commit + (" (tracked files modified: the code that ran differs from this commit)"
                          if pv.git_dirty else "")),
        ("python", pv.python), ("torch", pv.torch), ("opacus", pv.opacus),
        ("timm", pv.timm), ("device", pv.device if not pv.device_name else f"{pv.device} ({pv.device_name})"),
        ("seed", pv.seed), ("config file", pv.config_file),
        ("config sha256", pv.config_sha256), ("original command", pv.command),
        ("model", f"{md.arch} ({md.param_count:,} parameters, {md.trainable_param_count:,} trained)"),
        ("weights sha256", md.weights_sha256),
        ("dataset", f"{dt.dataset} / {dt.split} (pool of {dt.pool_size:,}"
                    f"{', streamed from disk' if dt.streamed else ''})"),
        ("pool fingerprint", dt.pool_fingerprint), ("membership sha256", dt.membership_sha256),
    ]
    if run.attack is not None and run.attack.setup.recipe_hash:
        items.append(("attack recipe hash", run.attack.setup.recipe_hash))
    items += code_items(run)
    cmds = []
    if run.config is not None:
        cmds.append(commands["train"])
    cmds += [c for c in (commands["attack"], commands["epsilon"], commands["transfer"], commands["report"])
             if c.startswith("audit ")]
    return ProvenanceSection(items=[(k, fmt.MISSING if v is None else str(v)) for k, v in items], commands=cmds)


def code_items(run: RunFiles) -> list[tuple[str, str]]:
    """Provenance rows: the code the run names (import-path ``model.arch`` fields) and whether the audit ran it.

    "code trusted" lists the commands whose results were made with ``--trust-code``
    (:mod:`training.trust`); without it no code named by the run directory was imported.
    """
    named = [str(ref) for ref in code_in_run(run.run_dir)]
    # a command "ran the code" only when the run named code and the command was allowed to import it: the trust
    # flag alone (audit run trusts your own config) imports nothing when the run names no code
    trusted = [cmd for cmd, res in (("audit attack", run.attack), ("audit epsilon", run.epsilon),
                                    ("audit transfer", run.transfer))
               if res is not None and res.code is not None and res.code.trust_code and res.code.names_code]
    if trusted:
        verdict = (f"yes: {', '.join(trusted)} imported it (trusted with --trust-code, or by audit run of your "
                   f"own config)")
    elif named:
        verdict = "no: the code it names was not run (--trust-code not given)"
    else:
        verdict = "no (not needed: the run names no code)"
    return [("code named by the run", "; ".join(named) if named else "none (registered or timm architectures)"),
            ("code trusted", verdict)]
