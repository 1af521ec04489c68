# Thin wrapper over CMake. `make` builds, `make test` builds and runs every
# test, `make run` starts lnormd in the foreground. Each installs missing
# Debian packages first (scripts/bootstrap).
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=
LNORMD_FLAGS ?=

.PHONY: all bootstrap configure build test run test-asan clean device-build gpu-test wheel

all: build

bootstrap:
	@bash scripts/bootstrap

$(BUILD)/CMakeCache.txt: | bootstrap
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

configure: bootstrap
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_FLAGS)

run: build
	$(BUILD)/server/lnormd $(LNORMD_FLAGS)

# The Python package (client/python) as a wheel carrying this build's
# liblnorm, in $(BUILD)/wheel.
wheel: build
	bash scripts/build-wheel.sh $(BUILD) $(BUILD)/wheel

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer (no CUDA).
test-asan:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DLNORM_SANITIZE=ON -DLNORM_WITH_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug"

# Static sm_90 build to carry to the GPU machine (see docs/gpu.md).
device-build: bootstrap
	cmake -S . -B build-sm90 -DLNORM_WITH_CUDA=ON -DLNORM_STATIC_DEPS=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_BUILD_TYPE=Release
	cmake --build build-sm90 -j $(JOBS)

# The GPU proof on a machine with an NVIDIA GPU and the Debian packages: build
# the static sm_90 tree, then run every GPU test, the sanitizers and the kernel
# benchmark (logs and JSON in $(GPU_OUT)). On a bare GPU machine, build here
# with `make device-build` and run scripts/device-gpu.sh there (docs/gpu.md).
GPU_OUT ?= device-out
gpu-test: device-build
	OUT=$(GPU_OUT) bash scripts/device-gpu.sh build-sm90

clean:
	rm -rf $(BUILD)
