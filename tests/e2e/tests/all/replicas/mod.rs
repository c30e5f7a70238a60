//! Control-plane replicas (the real binary, several on one PostgreSQL
//! database) under the router and members that use them: what killing
//! them, or restarting their PostgreSQL server, costs. PostgreSQL comes from `.ci/postgres.sh`; without a server
//! these tests fail where PostgreSQL is required (CI) and elsewhere note
//! that they did not run.

mod kills;
mod load;
mod set;
mod store_restart;
