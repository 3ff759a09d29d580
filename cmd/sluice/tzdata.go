package main

// The time zone database is built in, so that the time zones of schedules
// and calendar periods load on machines without one (distroless and
// scratch images); the system's, when there is one, is read first.
import _ "time/tzdata"
