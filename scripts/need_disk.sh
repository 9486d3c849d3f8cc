#!/usr/bin/env bash
# Usage: scripts/need_disk.sh GIB WHAT
# Fails, before anything is written, when the file system holding the current folder has less than GIB
# GiB free: an install that runs out of space part-way leaves a broken venv and a pip error far from its
# cause ("No space left on device" after minutes of downloads). The Makefile calls it before each venv.
set -euo pipefail
need=$1
what=$2
free=$(df -Pk . | awk 'NR==2 {print int($4 / 1048576)}')
if [ "$free" -lt "$need" ]; then
	echo "error: $what needs about $need GiB free on $(df -P . | awk 'NR==2 {print $6}') and $free GiB is;" \
		"free some space (old runs/, other checkouts' venvs) and run it again" >&2
	exit 1
fi
