# diffuse — top-level commands. The real build is CMake; this file only drives it.
#
#   make deps    install the Debian packages diffuse needs (as root; does nothing if present)
#   make         Release build: build/bin/{diffuse,diffuse-bench,diffuse-check}
#   make check   deps, then a Release build and a Debug ASan+UBSan build, each running ctest,
#                then every fuzz target for a few seconds (FUZZ_CHECK_SECONDS)
#   make demo    build, draw demo/demo.png from the shipped, trained tiny FLUX.1 pipeline
#                models/demo (DEMO_PROMPT="..." for another caption; tools/train-demo)
#   make demo-img2img  then redraw demo/demo.png with its shape recoloured by the caption
#                (image to image, DEMO_IMG2IMG_PROMPT)
#   make demo-sd3  the same with a tiny SD3.5-architecture pipeline (CFG, skip-layer guidance)
#   make demo-flux2  the same with tiny FLUX.2 pipelines (Flux2Pipeline with a Mistral 3
#                    encoder, and a distilled Flux2KleinPipeline with Qwen3)
#   make fuzz    build the libFuzzer targets with clang and run each for FUZZ_SECONDS
#   make install PREFIX=/usr/local

JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local
FUZZ_SECONDS ?= 60
FUZZ_CHECK_SECONDS ?= 10
CTEST_FLAGS ?= --output-on-failure -j$(JOBS)

DEB_PACKAGES = build-essential cmake pkg-config libcmocka-dev libcjson-dev libspng-dev \
               libturbojpeg0-dev \
               libutf8proc-dev libpcre2-dev libdnnl-dev libopenmpi-dev openmpi-bin clang \
               libclang-rt-14-dev libomp-dev \
               mesa-vulkan-drivers libvulkan-dev glslc vulkan-validationlayers vulkan-tools \
               libmicrohttpd-dev chromium chromium-driver python3-venv

.PHONY: all deps build check check-release check-asan demo demo-img2img demo-sd3 demo-flux2 fuzz install clean

all: build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	    dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then echo "deps: all packages present"; \
	elif [ "$$(id -u)" != 0 ]; then echo "deps: missing:$$missing (run 'make deps' as root)"; exit 1; \
	else echo "deps: installing$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi

build:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) >/dev/null
	cmake --build build -j$(JOBS)

check: deps check-release check-asan
	$(MAKE) fuzz FUZZ_SECONDS=$(FUZZ_CHECK_SECONDS)

check-release: build
	cd build && ctest $(CTEST_FLAGS)

check-asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDIFFUSE_SANITIZE=ON >/dev/null
	cmake --build build-asan -j$(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest $(CTEST_FLAGS)

DEMO_PROMPT ?= a large yellow circle in the top left corner on a blue background
# demo-img2img redraws demo/demo.png from itself with this caption (tests/unit/test_demo.c
# runs the same commands with these prompts and scores the result)
DEMO_IMG2IMG_PROMPT ?= a large red circle in the top left corner on a blue background
demo: deps build
	mkdir -p demo
	./build/bin/diffuse generate -m models/demo -p "$(DEMO_PROMPT)" --seed 42 \
	    -o demo/demo.png --stats-json demo/stats.json
	./build/bin/diffuse info demo/demo.png

demo-img2img: demo
	./build/bin/diffuse generate -m models/demo -p "$(DEMO_IMG2IMG_PROMPT)" --image demo/demo.png \
	    --strength 0.6 --seed 42 -o demo/demo-img2img.png
	./build/bin/diffuse info demo/demo-img2img.png

demo-sd3: deps build
	./build/bin/diffuse make-tiny --arch sd3 demo/tiny-sd3
	./build/bin/diffuse generate -m demo/tiny-sd3 -p "a red fox in the snow, watercolor" \
	    --negative-prompt "blurry" -W 256 -H 256 --steps 8 --guidance 4.5 --slg-layers 1 \
	    --seed 42 -o demo/demo-sd3.png --stats-json demo/stats-sd3.json
	./build/bin/diffuse info demo/demo-sd3.png

demo-flux2: deps build
	./build/bin/diffuse make-tiny --arch flux2 demo/tiny-flux2
	./build/bin/diffuse generate -m demo/tiny-flux2 -p "a red fox in the snow, watercolor" \
	    -W 256 -H 256 --steps 8 --seed 42 -o demo/demo-flux2.png --stats-json demo/stats-flux2.json
	./build/bin/diffuse info demo/demo-flux2.png
	./build/bin/diffuse make-tiny --arch flux2-klein demo/tiny-flux2-klein
	./build/bin/diffuse generate -m demo/tiny-flux2-klein -p "a red fox in the snow, watercolor" \
	    -W 256 -H 256 --seed 42 -o demo/demo-flux2-klein.png
	./build/bin/diffuse info demo/demo-flux2-klein.png

fuzz:
	cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	    -DCMAKE_BUILD_TYPE=Debug -DDIFFUSE_FUZZ=ON >/dev/null
	cmake --build build-fuzz -j$(JOBS)
	cd build-fuzz && for f in bin/fuzz_*; do \
	    name=$$(basename $$f); mkdir -p fuzz-corpus/$$name; \
	    ./$$f -max_total_time=$(FUZZ_SECONDS) -timeout=10 fuzz-corpus/$$name \
	        ../tests/fuzz/corpus/$${name#fuzz_} || exit 1; done

install: build
	cmake --install build

clean:
	rm -rf build build-asan build-fuzz demo
