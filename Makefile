# Thin wrappers: the scripts are the source of truth (they work without make).
.PHONY: test bench lint fuzz build

build:
	go build -buildvcs=auto -o bin/sluice ./cmd/sluice

test:
	scripts/test

bench:
	scripts/bench

lint:
	gofmt -l $$(git ls-files '*.go')
	go vet ./...
	go tool -modfile=tools/go.mod staticcheck ./...

fuzz:
	scripts/fuzz
