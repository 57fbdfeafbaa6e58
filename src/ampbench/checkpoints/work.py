"""A train stage's work folder, ``checkpoints/<variant>/``: what a re-run resumes, what it skips,
and publishing the finished models into the stage's DVC output.

- ``load_resume``: the checkpoint a seed continues from; one of another configuration stops the
  stage (``ResumeError``) unless ``--fresh`` discards it.
- ``finished``: a seed already trained in this stage (its ``model.pt``), not trained again.
- ``resume_hint``: the command a stopped stage's message gives to resume it.
- ``restore``: a checkpoint into the trainer; one of other shapes is one line naming --fresh.
- ``check_writable``: before any training, both folders can take files and an existing
  ``models/<variant>`` can be replaced (else one line now, not a traceback after the whole training).
- ``publish``: once every seed is done, hard-link the models into ``models/<variant>/`` and remove
  the work folder, so a later run trains afresh.

The strategy given to ``load_resume`` is the training's parallel strategy (its ``barrier`` and
``is_main``): every rank reads the checkpoint before rank 0 may discard it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shlex
import shutil
from pathlib import Path

from ampbench.checkpoints import files
from ampbench.checkpoints.state import ModelFile, SeedCheckpoint
from ampbench.config.strict import shown
from ampbench.paths import (
    READ_ONLY,
    cannot_hold,
    mount_point,
    owned_by,
    remount,
    temp_workspace_root,
    unreplaceable,
    unwritable,
)

log = logging.getLogger(__name__)


class ResumeError(RuntimeError):
    """A checkpoint exists for a different configuration."""


def load_resume(
    ckpt: Path, digest: str, variant: str, fresh: bool, strategy, settings: dict | None = None
) -> SeedCheckpoint | None:
    """The checkpoint to continue from, if any. One that cannot be resumed (another configuration,
    an older format, unreadable) raises. ``fresh``: any checkpoint is discarded, resumable or
    not (a model's code may have changed where the configuration digest cannot see it)."""
    state, problem = None, ""
    if ckpt.exists():
        try:
            state = SeedCheckpoint.load(ckpt)
        except files.CheckpointError as err:
            if not fresh:
                raise
            problem = str(err)
    strategy.barrier()  # every rank has read it before rank 0 may discard it
    if state is None and not problem:
        return None
    if not fresh:
        if state is not None and state.matches(digest, variant):
            return state
        raise _foreign(ckpt, state, variant, digest, settings)
    if strategy.is_main:
        log.warning("discarding %s (%s): --fresh", ckpt, problem or "starting the seed over")
        ckpt.unlink(missing_ok=True)
    return None


def _foreign(
    ckpt: Path, state: SeedCheckpoint, variant: str, digest: str, settings: dict | None
) -> ResumeError:
    return ResumeError(
        f"{ckpt} was written by variant {state.variant!r} with config "
        f"{state.config_digest}, but this run is {variant!r} with config {digest}"
        f"{_changed(ckpt, settings)}. Resuming would mix two experiments. Restore the old params to "
        f"resume, or discard the checkpoint and start over: {_fresh_command(variant, ckpt)}."
    )


_stage_argv: list[str] = []  # the train stage's own arguments, within stage_command()


@contextlib.contextmanager
def stage_command(argv: list[str]):
    """Within: the train stage's own arguments, which a fix that starts afresh repeats with its
    --params and --set (hostile pass L: "`ampbench train --parallel X --precision Y --fresh`",
    run as printed, trained params.yaml's settings, not the user's)."""
    global _stage_argv
    before, _stage_argv = _stage_argv, list(argv)
    try:
        yield
    finally:
        _stage_argv = before


def _fresh_command(variant: str, ckpt: Path) -> str:
    """The command that trains `variant` from the start (what `make run` cannot be told); under
    DVC, the pipeline's after the checkpoints go (hostile pass O: the stage's own `--fresh` left
    dvc.lock stale, and the pipeline then trained the variant a second time)."""
    if os.environ.get("DVC_STAGE"):
        folder = shlex.quote(os.path.relpath(ckpt.parent.parent))
        again = os.environ.get("AMPBENCH_RESUME_COMMAND") or "the pipeline command that started this stage"
        return f"`rm -r {folder}`, then {again} again"
    if _stage_argv:
        return f"`{fresh_command(_stage_argv)}`"
    parallel_name, _, precision_name = variant.partition("-")
    if not precision_name:  # a checkpoint written outside a stage names no variant
        return "`ampbench train ... --fresh`"
    return f"`ampbench train --parallel {parallel_name} --precision {precision_name} --fresh`"


def _changed(ckpt: Path, settings: dict | None) -> str:
    """' (train.lr 0.05 -> 0.1, ...)': the settings that differ from those the seed's run.json
    recorded when it started; '' where either is unknown (an older run.json)."""
    try:
        before = json.loads(ckpt.with_name("run.json").read_text(encoding="utf-8")).get("settings")
    except (OSError, ValueError, AttributeError):
        return ""
    if not isinstance(before, dict) or not settings:
        return ""
    now = json.loads(json.dumps(settings, default=str))  # as run.json holds them: tuples as lists
    keys = sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))
    return (
        " (" + ", ".join(f"{k} {shown(before.get(k))} -> {shown(now.get(k))}" for k in keys) + ")"
        if keys
        else ""
    )


def refuse_foreign(
    work: Path, seeds, digest: str, variant: str, fresh: bool, settings: dict | None = None
) -> None:
    """Before any run is created: a checkpoint of another configuration (or format) stops the stage,
    that of a seed the list no longer holds too (hostile pass N: train.seeds [0, 1] -> [0] after a
    stop in seed 1: its checkpoint went with the publish, without a word)."""
    if fresh:
        return
    listed = [work / f"seed-{seed}" / "checkpoint.pt" for seed in seeds]
    for ckpt in dict.fromkeys([*listed, *sorted(work.glob("seed-*/checkpoint.pt"))]):
        if ckpt.exists() and not (state := SeedCheckpoint.load(ckpt)).matches(digest, variant):
            raise _foreign(ckpt, state, variant, digest, settings)


def check_writable(work: Path, out: Path) -> None:
    """The work folder and the models' folder can be made and take files (``paths.unwritable``'s
    probe), and a models folder of an earlier run can be replaced (``check_replaceable``): a
    read-only or foreign-owned folder, a file in a folder's place, a read-only filesystem fail
    here, before any training, instead of when the trained models are saved or published."""
    for folder, holds in ((work, "work in progress (checkpoints)"), (out.parent, "trained models")):
        reason = unwritable(folder)
        if reason:
            raise files.CheckpointError(cannot_hold(folder, holds, reason))
    check_replaceable(out)


def check_replaceable(out: Path) -> None:
    """``publish`` removes an existing ``models/<variant>`` and renames the new one into its place:
    it must be a folder whose every subfolder this user may change. A `sudo make run` leaves
    root-owned seed folders inside the user's models/ (the rename then fails: Directory not empty)."""
    if not (out.exists() or out.is_symlink()):
        return
    rerun = "then re-run (nothing was trained)"
    if out.is_symlink() or not out.is_dir():
        what = "a symbolic link" if out.is_symlink() else "a file"
        raise files.CheckpointError(
            f"{out} is {what}, not a folder, and this stage publishes its models there: remove it "
            f"(`rm {out}`), {rerun}"
        )
    if mount_point(out):  # hostile pass C8: no chown, remount or rm lets a rename replace it
        raise files.CheckpointError(
            f"{out} is a mount point, which this stage cannot replace (it renames the new models into its "
            f"place): unmount it (`umount {out}`), or mount {out.parent}/ instead, {rerun}"
        )
    if found := unreplaceable(out):
        where, reason = found
        owner = owned_by(where)
        fix = f"give it back (`sudo chown -R $USER {out}`)" if owner else "make it writable by this user"
        if "chattr" not in reason:  # an immutable folder cannot be removed either (hostile pass D)
            fix += f" or remove it (`sudo rm -r {out}`)"
        fix = remount(where) if reason == READ_ONLY else fix
        raise files.CheckpointError(
            f"{out} cannot be replaced by this stage's models: {where}{owner} ({reason}): {fix}, {rerun}"
        )


def publish(work: Path, out: Path, seeds) -> None:
    """Every seed is done: hard-link the models into the DVC output (beside the models there of
    other seeds), then drop the work folder.
    A failure (``models/`` changed after ``check_writable``) is one line; the staging folder goes,
    the work folder stays: the same command publishes its models without training them again."""
    staging = out.with_name(f".{out.name}.publishing")
    try:
        shutil.rmtree(staging, ignore_errors=True)
        for seed in seeds:
            target = staging / f"seed-{seed}" / "model.pt"
            target.parent.mkdir(parents=True)
            try:
                os.link(work / f"seed-{seed}" / "model.pt", target)  # no second copy of the weights
            except OSError:  # a filesystem without hard links
                shutil.copy2(work / f"seed-{seed}" / "model.pt", target)
        for other in sorted(out.glob("seed-*")):  # seeds not trained now stay (hostile pass F9: gone)
            if not (staging / other.name).exists():  # linked, not moved: a failure leaves them there
                shutil.copytree(other, staging / other.name, copy_function=os.link)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(staging, out)
    except OSError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise files.CheckpointError(_publish_failed(err, work, out)) from None
    shutil.rmtree(work)


def _publish_failed(err: OSError, work: Path, out: Path) -> str:
    """The one line for a publish that failed: a full disk (models/ on another filesystem than
    checkpoints/, where models are copied, not linked) or a folder this user cannot replace."""
    # the command without --fresh, which would train them again (hostile pass M)
    again = shlex.join(["ampbench", *(a for a in _stage_argv if a != "--fresh")]) if _stage_argv else ""
    rerun = f"re-run `{again}`" if "--fresh" in _stage_argv else "re-run the same command"
    wait = f"then {rerun}: the models wait in {work}/ and are not trained again"
    if err.errno == errno.EROFS:  # no chown changes a read-only filesystem
        return (
            f"could not publish the trained models into {out}: its filesystem is read-only; mount it "
            f"writable, {wait}"
        )
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        free = shutil.disk_usage(out.parent).free if out.parent.is_dir() else 0
        return (
            f"{os.strerror(err.errno)}: could not copy the trained models into {out} ({free / 2**20:.1f} "
            f"MiB free there; they are copied, not linked, where {out.parent}/ is on another filesystem "
            f"than {work.parent}/): free space there, or point {out.parent} elsewhere, {wait}"
        )
    return (
        f"could not publish the trained models into {out} ({err.filename or out}: "
        f"{err.strerror or type(err).__name__}): make {out} a folder this user can replace "
        f"(`sudo chown -R $USER {out}`, or remove it), {wait}"
    )


def finished(final: Path, variant: str, digest: str, fresh: bool) -> ModelFile | None:
    """A seed this stage already trained (its model.pt in the work folder), else None.

    One of another configuration is trained again (and replaced); an unreadable one or one of an
    older format raises. ``fresh``: none is kept, every seed is trained again.
    """
    if fresh or not final.exists():
        return None
    saved = ModelFile.load(final)
    return saved if saved.matches(digest, variant) else None


def resume_hint(argv: list[str]) -> str:
    """The exact command that resumes a stopped stage (a re-run finds the checkpoint): the one that
    started the pipeline when it says so (`make run` sets AMPBENCH_RESUME_COMMAND), else this one;
    in a DVC temporary workspace (deleted when the experiment stops), queuing it again."""
    if temp_workspace_root() is not None:
        return (
            "To resume, queue the same experiment again (`dvc exp run --queue` with the same -S "
            "settings, then `dvc queue start`): its work is kept outside DVC's temporary copy"
        )
    started_by = os.environ.get("AMPBENCH_RESUME_COMMAND")
    if started_by:
        return f"To resume: {started_by}"
    if os.environ.get("DVC_STAGE"):  # hostile pass L: this stage's own command left dvc.lock stale,
        # and the pipeline's next run trained the variant again from scratch
        return (
            "To resume, run the pipeline command that started this stage again (`dvc repro`, `make run` "
            "or `python -m ampbench.dvc_run repro`): it continues from this checkpoint"
        )
    command = shlex.join(["ampbench", *(a for a in argv if a != "--fresh")])  # would start over
    return f"To resume, run the same command again: {command} (or the dvc repro / make run that started it)"


def fresh_command(argv: list[str]) -> str:
    """The exact command that trains the stage's variant from the start: its own, with --fresh
    (hostile pass J: `ampbench train --parallel X --precision Y --fresh`, without the user's --set,
    trained params.yaml's settings instead)."""
    return shlex.join(["ampbench", *(a for a in argv if a != "--fresh"), "--fresh"])


def restore(trainer, resume: SeedCheckpoint, path: Path) -> None:
    """The checkpoint's state into this trainer; one of other shapes (the model's code changed
    since it was written: the configuration digest cannot see that) is one line, not a traceback."""
    try:
        trainer.load(resume.trainer_state())
    except (RuntimeError, KeyError, ValueError) as err:
        first = " ".join(str(err).split())[:160]
        raise files.CheckpointError(
            f"{path} does not fit this model ({type(err).__name__}: {first}); it was written by "
            f"another version of the model's code: discard it with {_fresh_command(resume.variant, path)}"
        ) from None
