"""A Hugging Face cache laid out by huggingface_hub's own functions, offline: what `hf download ORG/NAME` leaves
(blobs named by content hash, snapshots/COMMIT/FILE symlinks to them, refs/main naming the commit), built from a
local model directory. Nothing touches the network; huggingface_hub's scan_cache_dir reads it back as a repo."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_model_dir(source: Path, cache: Path, repo_id: str, commit: str = COMMIT) -> Path:
    """Put every file of `source` into the cache `cache` (an HF_HUB_CACHE) as repo_id's `main`; returns the
    snapshot directory."""
    from huggingface_hub import file_download

    storage = cache / file_download.repo_folder_name(repo_id=repo_id, repo_type="model")
    file_download._cache_commit_hash_for_specific_revision(str(storage), "main", commit)
    for file in sorted(p for p in source.iterdir() if p.is_file()):
        blob = storage / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, blob)
        pointer = Path(file_download._get_pointer_path(str(storage), commit, file.name))
        pointer.parent.mkdir(parents=True, exist_ok=True)
        file_download._create_symlink(str(blob), str(pointer), new_blob=False)
    return storage / "snapshots" / commit
