-- 0022: which job each start of a rate-limited key belongs to.
--
-- The keyed claim stamps a start per rate-limited job it claims. A worker
-- whose job would start its function later than the rate window's margin
-- after the claim was sent moves that job's stamp to the moment it really
-- starts (if the window still has room; otherwise it hands the job back and
-- drops the stamp): the column finds the job's own stamp. Rows written
-- before this migration (or by an older worker) have none.
ALTER TABLE scheduler_key_starts ADD COLUMN IF NOT EXISTS job_id TEXT;
