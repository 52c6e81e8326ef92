# SPDX-License-Identifier: MIT
# A thin wrapper over build.sh for those who type make.
.PHONY: all run test asan valgrind format clean
all run:
	./build.sh run
test:
	./build.sh test
asan:
	./build.sh asan
valgrind:
	./build.sh valgrind
format:
	git ls-files '*.c' '*.h' | xargs clang-format -i
clean:
	rm -rf build build-asan build.setup.log build-asan.setup.log
