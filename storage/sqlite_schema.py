"""The SQLite schema at the newest migration, as the migrations leave it in `sqlite_master`.

A new, empty SQLite database is given this schema directly (storage.db.migrate) instead of running
the migrations through Alembic, which would cost a first start ~0.2 s and ~9 MB. The statements
are the `sql` column of a database Alembic migrated, in creation order, so executing them gives
the very same `sqlite_master`: same tables, columns, types, defaults, keys, indexes and text.
`alembic_version` is part of it, so every later start and later migration see an ordinary
migrated database. When REVISION is not the newest migration, Alembic migrates as before.

tests/test_migrations_head.py compares this with a migrated database and prints the new text
when a migration is added (`python -m tests.test_migrations_head` writes it).
"""

REVISION = '0021'

STATEMENTS: tuple[str, ...] = (
    ('CREATE TABLE alembic_version (\n'
     '\tversion_num VARCHAR(32) NOT NULL, \n'
     '\tCONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)\n'
     ')'),
    ('CREATE TABLE tasks (\n'
     '\tid VARCHAR(64) NOT NULL, \n'
     '\tname VARCHAR(1024) NOT NULL, \n'
     '\tdescription TEXT, \n'
     '\tuser_id VARCHAR(255), \n'
     '\tparent_id VARCHAR(64), \n'
     '\ttask_tree_id VARCHAR(64) NOT NULL, \n'
     '\tpriority INTEGER NOT NULL, \n'
     '\tdependencies JSON NOT NULL, \n'
     '\tinputs JSON NOT NULL, \n'
     '\tparams JSON NOT NULL, \n'
     '\tschemas JSON NOT NULL, \n'
     '\tstatus VARCHAR(16) NOT NULL, \n'
     '\tprogress FLOAT NOT NULL, \n'
     '\tresult JSON, \n'
     '\terror TEXT, \n'
     '\tcreated_at VARCHAR(40) NOT NULL, \n'
     '\tupdated_at VARCHAR(40) NOT NULL, \n'
     '\tstarted_at VARCHAR(40), \n'
     '\tcompleted_at VARCHAR(40), \n'
     '\tproduct_id VARCHAR(255), \n'
     '\ttoken_success INTEGER NOT NULL, \n'
     '\ttoken_failed INTEGER NOT NULL, \n'
     '\toriginal_task_id VARCHAR(64), \n'
     '\thas_copy BOOLEAN NOT NULL, \n'
     '\thas_references BOOLEAN NOT NULL, \n'
     '\torigin_type VARCHAR(16) NOT NULL, \n'
     '\textra JSON NOT NULL, \n'
     '\tlease_owner VARCHAR(64), \n'
     '\tlease_expires_at VARCHAR(40), retry JSON, timeout_seconds FLOAT, '
     "attempt INTEGER DEFAULT '0' NOT NULL, next_attempt_at VARCHAR(40), checkpoint JSON, "
     "lease_epoch INTEGER DEFAULT '0' NOT NULL, execution_id VARCHAR(64), "
     "interruptions INTEGER DEFAULT '0' NOT NULL, concurrency JSON, rate_limit JSON, "
     'concurrency_key VARCHAR(255), waiting TEXT, wait_answers TEXT, wake_at VARCHAR(40), '
     'usage JSON, budget JSON, \n'
     '\tPRIMARY KEY (id), \n'
     '\tFOREIGN KEY(parent_id) REFERENCES tasks (id) DEFERRABLE INITIALLY DEFERRED\n'
     ')'),
    ('CREATE INDEX ix_tasks_task_tree_id ON tasks (task_tree_id)'),
    ('CREATE TABLE llm_keys (\n'
     '\tuser_id VARCHAR(255) NOT NULL, \n'
     '\tprovider VARCHAR(64) NOT NULL, \n'
     '\tciphertext BLOB NOT NULL, \n'
     '\tcreated_at VARCHAR(40) NOT NULL, \n'
     '\tupdated_at VARCHAR(40) NOT NULL, \n'
     '\tPRIMARY KEY (user_id, provider)\n'
     ')'),
    ('CREATE TABLE a2a_tasks (\n'
     '\tid VARCHAR(64) NOT NULL, \n'
     '\tcontext_id VARCHAR(64) NOT NULL, \n'
     '\tkind VARCHAR(16) NOT NULL, \n'
     '\towner VARCHAR(255), \n'
     '\tlast_updated DATETIME, \n'
     '\tstatus JSON NOT NULL, \n'
     '\tartifacts JSON, \n'
     '\thistory JSON, \n'
     '\tprotocol_version VARCHAR(16), \n'
     '\tmetadata JSON, \n'
     '\tPRIMARY KEY (id)\n'
     ')'),
    ('CREATE INDEX ix_a2a_tasks_id ON a2a_tasks (id)'),
    ('CREATE INDEX ix_a2a_tasks_context_id ON a2a_tasks (context_id)'),
    ('CREATE INDEX idx_a2a_tasks_owner_last_updated ON a2a_tasks (owner, last_updated)'),
    ('CREATE TABLE a2a_push_configs (\n'
     '\ttask_id VARCHAR(64) NOT NULL, \n'
     '\tconfig_id VARCHAR(255) NOT NULL, \n'
     '\tconfig_data BLOB NOT NULL, \n'
     '\towner VARCHAR(255), \n'
     '\tprotocol_version VARCHAR(16), \n'
     '\tPRIMARY KEY (task_id, config_id)\n'
     ')'),
    ('CREATE INDEX ix_a2a_push_configs_owner ON a2a_push_configs (owner)'),
    ('CREATE INDEX ix_tasks_execution_id ON tasks (execution_id)'),
    ('CREATE TABLE executions (\n'
     '\tid VARCHAR(64) NOT NULL, \n'
     '\ttask_tree_id VARCHAR(64) NOT NULL, \n'
     '\ttask_id VARCHAR(64) NOT NULL, \n'
     '\tuser_id VARCHAR(255), \n'
     '\tstatus VARCHAR(16) NOT NULL, \n'
     '\tfinal_status VARCHAR(16), \n'
     '\twebhooks JSON NOT NULL, \n'
     '\towner VARCHAR(64), \n'
     '\tepoch INTEGER NOT NULL, \n'
     '\tlease_expires_at VARCHAR(40), \n'
     '\tcreated_at VARCHAR(40) NOT NULL, \n'
     '\tupdated_at VARCHAR(40) NOT NULL, \n'
     '\tended_at VARCHAR(40), traceparent VARCHAR(64), \n'
     '\tPRIMARY KEY (id)\n'
     ')'),
    ('CREATE INDEX ix_executions_status_lease ON executions (status, lease_expires_at)'),
    ("CREATE UNIQUE INDEX ux_executions_running_tree ON executions (task_tree_id) WHERE status = 'running'"),
    ('CREATE TABLE idempotency_keys (\n'
     '\towner VARCHAR(255) NOT NULL, \n'
     '\t"key" VARCHAR(255) NOT NULL, \n'
     '\tmethod VARCHAR(64) NOT NULL, \n'
     '\tfingerprint VARCHAR(64) NOT NULL, \n'
     '\tanswer JSON, \n'
     '\tcreated_at VARCHAR(40) NOT NULL, \n'
     '\tPRIMARY KEY (owner, "key")\n'
     ')'),
    ('CREATE TABLE schedules (\n'
     '\tid VARCHAR(64) NOT NULL, \n'
     '\ttask_id VARCHAR(64) NOT NULL, \n'
     '\tuser_id VARCHAR(255), \n'
     '\tcron VARCHAR(255), \n'
     '\tinterval_seconds FLOAT, \n'
     '\ttimezone VARCHAR(64) NOT NULL, \n'
     '\tenabled BOOLEAN NOT NULL, \n'
     '\tmax_runs INTEGER, \n'
     '\tstart_at VARCHAR(40), \n'
     '\tend_at VARCHAR(40), \n'
     '\toverlap VARCHAR(16) NOT NULL, \n'
     '\tcatch_up VARCHAR(16) NOT NULL, \n'
     '\twebhook_config JSON, \n'
     '\tnext_run_at VARCHAR(40), \n'
     '\tlast_run_at VARCHAR(40), \n'
     '\tlast_slot VARCHAR(40), \n'
     '\tlast_root_task_id VARCHAR(64), \n'
     "\truns INTEGER DEFAULT '0' NOT NULL, \n"
     "\tskipped INTEGER DEFAULT '0' NOT NULL, \n"
     '\tlast_skipped_at VARCHAR(40), \n'
     '\tcreated_at VARCHAR(40) NOT NULL, \n'
     '\tupdated_at VARCHAR(40) NOT NULL, \n'
     '\tPRIMARY KEY (id)\n'
     ')'),
    ('CREATE INDEX ix_schedules_due ON schedules (enabled, next_run_at)'),
    ('CREATE INDEX ix_schedules_user_id ON schedules (user_id)'),
    ('CREATE INDEX ix_tasks_concurrency_key ON tasks (concurrency_key, '
     'status) WHERE concurrency_key IS NOT NULL'),
    ('CREATE TABLE rate_limits (\n'
     '\t"key" VARCHAR(255) NOT NULL, \n'
     '\tnext_at VARCHAR(40) NOT NULL, \n'
     '\tupdated_at VARCHAR(40) NOT NULL, \n'
     '\tPRIMARY KEY ("key")\n'
     ')'),
    ('CREATE INDEX ix_tasks_wake_at ON tasks (wake_at) WHERE wake_at IS NOT NULL'),
    ('CREATE TABLE events (\n'
     '\tid VARCHAR(64) NOT NULL, \n'
     '\tuser_id VARCHAR(255), \n'
     '\tname VARCHAR(255) NOT NULL, \n'
     '\tpayload JSON NOT NULL, \n'
     '\tcreated_at VARCHAR(40) NOT NULL, \n'
     '\tPRIMARY KEY (id)\n'
     ')'),
    ('CREATE INDEX ix_events_user_name_created ON events (user_id, name, created_at)'),
    ('CREATE TABLE task_logs (\n'
     '\tseq INTEGER NOT NULL, \n'
     '\ttask_id VARCHAR(64) NOT NULL, \n'
     '\tattempt INTEGER NOT NULL, \n'
     '\tat VARCHAR(40) NOT NULL, \n'
     '\tstream VARCHAR(8) NOT NULL, \n'
     '\tlevel VARCHAR(16), \n'
     '\ttext TEXT NOT NULL, \n'
     '\tPRIMARY KEY (seq)\n'
     ')'),
    ('CREATE INDEX ix_task_logs_task_seq ON task_logs (task_id, seq)'),
    ('CREATE TABLE task_attempts (\n'
     '\tid INTEGER NOT NULL, \n'
     '\ttask_id VARCHAR(64) NOT NULL, \n'
     '\tattempt INTEGER NOT NULL, \n'
     '\tqueued_at VARCHAR(40), \n'
     '\tstarted_at VARCHAR(40), \n'
     '\tended_at VARCHAR(40), \n'
     '\toutcome VARCHAR(16) NOT NULL, \n'
     '\terror TEXT, \n'
     '\tPRIMARY KEY (id)\n'
     ')'),
    ('CREATE INDEX ix_task_attempts_task_id ON task_attempts (task_id)'),
    ('CREATE TABLE llm_usage_daily (\n'
     '\tuser_id VARCHAR(255) NOT NULL, \n'
     '\tday VARCHAR(10) NOT NULL, \n'
     '\tprompt_tokens BIGINT NOT NULL, \n'
     '\tcompletion_tokens BIGINT NOT NULL, \n'
     '\ttotal_tokens BIGINT NOT NULL, \n'
     '\tcost_usd FLOAT NOT NULL, \n'
     '\tcalls INTEGER NOT NULL, \n'
     '\tunpriced_calls INTEGER NOT NULL, \n'
     '\tPRIMARY KEY (user_id, day)\n'
     ')'),
    ('CREATE TABLE user_budgets (\n'
     '\tuser_id VARCHAR(255) NOT NULL, \n'
     '\tmax_tokens BIGINT, \n'
     '\tmax_cost_usd FLOAT, \n'
     '\tupdated_at VARCHAR(40) NOT NULL, \n'
     '\tPRIMARY KEY (user_id)\n'
     ')'),
    ('CREATE INDEX ix_tasks_created_at ON tasks (created_at, id)'),
    ('CREATE INDEX ix_tasks_parent_id ON tasks (parent_id) WHERE parent_id IS NOT NULL'),
    ('CREATE INDEX ix_tasks_user_created ON tasks (user_id, created_at, id)'),
    ('CREATE INDEX ix_executions_task_tree_id ON executions (task_tree_id)'),
    ('CREATE INDEX ix_events_created ON events (created_at, id)'),
    ('CREATE INDEX ix_tasks_status_created ON tasks (status, created_at, id)'),
    ('CREATE INDEX ix_tasks_user_status_created ON tasks (user_id, status, created_at, id)'),
    ('CREATE TABLE agents (\n'
     '\tid VARCHAR(64) NOT NULL, \n'
     '\tname VARCHAR(128) NOT NULL, \n'
     '\tuser_id VARCHAR(255), \n'
     '\tshared BOOLEAN NOT NULL, \n'
     '\tcard_url VARCHAR(2048) NOT NULL, \n'
     '\ttags JSON NOT NULL, \n'
     '\tcard_name VARCHAR(1024), \n'
     '\tdescription TEXT, \n'
     '\tversion VARCHAR(255), \n'
     '\tprotocol_version VARCHAR(32), \n'
     '\tskills JSON NOT NULL, \n'
     '\tinterfaces JSON NOT NULL, \n'
     '\tetag VARCHAR(1024), \n'
     '\tlast_modified VARCHAR(255), \n'
     '\tfetched_at VARCHAR(40), \n'
     '\trefresh_due_at VARCHAR(40), \n'
     '\trefresh_error TEXT, \n'
     '\tchanged JSON, \n'
     '\tcredentials BLOB, \n'
     '\tconcurrency INTEGER, \n'
     '\thealth JSON NOT NULL, \n'
     '\tbreaker VARCHAR(16) NOT NULL, \n'
     '\tbreaker_until VARCHAR(40), \n'
     '\tcreated_at VARCHAR(40) NOT NULL, \n'
     '\tupdated_at VARCHAR(40) NOT NULL, \n'
     '\tPRIMARY KEY (id)\n'
     ')'),
    ('CREATE UNIQUE INDEX ux_agents_name ON agents (name)'),
    ('CREATE INDEX ix_agents_user_id ON agents (user_id)'),
    ('CREATE INDEX ix_agents_refresh_due ON agents (refresh_due_at)'),
    ('CREATE TABLE triggers (\n'
     '\tid VARCHAR(64) NOT NULL, \n'
     '\ttask_id VARCHAR(64) NOT NULL, \n'
     '\tuser_id VARCHAR(255), \n'
     '\tevent VARCHAR(255) NOT NULL, \n'
     '\t"match" JSON, \n'
     '\t"key" VARCHAR(255), \n'
     '\tdebounce JSON, \n'
     '\tbatch JSON, \n'
     '\tsingleton VARCHAR(16), \n'
     '\tcancel_on VARCHAR(255), \n'
     '\tenabled BOOLEAN NOT NULL, \n'
     '\tmatched INTEGER NOT NULL, \n'
     '\truns INTEGER NOT NULL, \n'
     '\tdebounced INTEGER NOT NULL, \n'
     '\tbatched INTEGER NOT NULL, \n'
     '\tskipped INTEGER NOT NULL, \n'
     '\tcancelled INTEGER NOT NULL, \n'
     '\tlast_run_at VARCHAR(40), \n'
     '\tlast_root_task_id VARCHAR(64), \n'
     '\tcreated_at VARCHAR(40) NOT NULL, \n'
     '\tupdated_at VARCHAR(40) NOT NULL, \n'
     '\tPRIMARY KEY (id)\n'
     ')'),
    ('CREATE INDEX ix_triggers_user_event ON triggers (user_id, event)'),
    ('CREATE INDEX ix_triggers_user_cancel_on ON triggers (user_id, cancel_on)'),
    ('CREATE TABLE trigger_events (\n'
     '\tseq INTEGER NOT NULL, \n'
     '\ttrigger_id VARCHAR(64) NOT NULL, \n'
     '\tevent_id VARCHAR(64) NOT NULL, \n'
     '\tkind VARCHAR(8) NOT NULL, \n'
     '\tgroup_key VARCHAR(255) NOT NULL, \n'
     '\tpayload JSON NOT NULL, \n'
     '\tcreated_at VARCHAR(40) NOT NULL, \n'
     '\thandled_at VARCHAR(40), \n'
     '\toutcome VARCHAR(16), \n'
     '\troot_task_id VARCHAR(64), \n'
     '\tPRIMARY KEY (seq), \n'
     '\tCONSTRAINT ux_trigger_events_event UNIQUE (trigger_id, event_id)\n'
     ')'),
    ('CREATE INDEX ix_trigger_events_pending ON trigger_events (handled_at, trigger_id, '
     'group_key, seq)'),
    ('CREATE TABLE trigger_runs (\n'
     '\troot_task_id VARCHAR(64) NOT NULL, \n'
     '\ttrigger_id VARCHAR(64) NOT NULL, \n'
     '\tgroup_key VARCHAR(255) NOT NULL, \n'
     '\tevents INTEGER NOT NULL, \n'
     '\tcreated_at VARCHAR(40) NOT NULL, \n'
     '\tcancel_reason TEXT, \n'
     '\tPRIMARY KEY (root_task_id)\n'
     ')'),
    ('CREATE INDEX ix_trigger_runs_group ON trigger_runs (trigger_id, group_key, created_at)'),
    ('CREATE INDEX ix_tasks_waiting_user ON tasks (user_id, created_at, '
     'id) WHERE waiting IS NOT NULL'),
    ('CREATE INDEX ix_tasks_waiting_created ON tasks (created_at, id) WHERE waiting IS NOT NULL'),
    ('CREATE INDEX ix_tasks_roots_created ON tasks (created_at, id, '
     'name) WHERE parent_id IS NULL'),
    ('CREATE INDEX ix_tasks_roots_user ON tasks (user_id, created_at, id, '
     'name) WHERE parent_id IS NULL'),
)
