// Package luasrc holds the Lua source that runs sluice's rate limiting
// algorithms inside Redis scripts: an exact integer library and a mirror of
// package algo, tested against algo on a real redis-server.
//
// Redis runs Lua 5.1, where every number is a double, exact only below
// 2^53, while algo computes with int64 nanoseconds (about 1.8e18 today) and
// 128-bit products such as Capacity*Period. int.lua represents a value
// below 2^53 as a plain Lua number, so that the common small values cost no
// allocation, and a larger one as a table of base-2^24 limbs, least
// significant first, marked by a metatable; every function takes either
// form and returns a number whenever the value is below 2^53. It provides
// parse and format of decimal strings, add, saturating sub, mul, divmod
// (short division with a floating-point estimate and an exact correction
// for divisors below 2^51, Knuth's Algorithm D otherwise), comparisons and
// saturation at math.MaxInt64, all exact. algo.lua defines algo.step,
// algo.log_step, algo.log_append, algo.slide_result and algo.sketch_window
// on these integers; the comments at the top of each file and of each
// function give the exact API. fast.lua computes the common cases in plain
// numbers (times relative to now, the quantities of a limit prepared by
// the Go side), where absolute nanosecond times would be limbs, and
// answers nil outside its domain; within it, it answers exactly as
// algo.lua does. It halves Redis's CPU per decision (measured at the top
// of fast.lua, against a build with -tags sluice_exactlua, where no limit
// takes it: exactonly.go).
//
// Both files are one chunk of local definitions (Redis forbids globals):
// a script is [Lib] followed by its own code, which sees the local tables
// int and algo. Every input must be a non-negative integer made by int.lua
// (int.parse of a decimal string, or a plain Lua number below 2^53); the
// Go side clamps times before the epoch and negative costs to 0 first.
//
// Defining Lib's functions costs a few microseconds, paid by every EVAL
// (BenchmarkLibPrefix), more than a decision itself (BenchmarkLuaStep).
// A Redis 7 function library (FUNCTION LOAD, FCALL) pays it once: wrap
// Lib and the script's code in a local function, call it on the first
// FCALL and keep what it returns in an upvalue, because code that runs
// while a library loads sees only the redis table, not type, math or
// string (see functionLib in the tests).
//
// The package imports algo (for Spec) and the standard library; its tests
// import internal/testsupport/redistest.
package luasrc

import _ "embed"

//go:embed int.lua
var intLua string

//go:embed algo.lua
var algoLua string

//go:embed fast.lua
var fastLua string

// Lib is int.lua, algo.lua and fast.lua, the prefix of every script that
// uses them.
var Lib = intLua + "\n" + algoLua + "\n" + fastLua
