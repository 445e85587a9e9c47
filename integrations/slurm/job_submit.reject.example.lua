--[[
Example job_submit/lua script that rejects every job with a message (NOT the Allmende plugin).
`sbatch` prints "sbatch: error: <message>" followed by
"sbatch: error: Batch job submission failed: ..." and exits 1.
]]

function slurm_job_submit(job_desc, part_list, submit_uid)
  slurm.log_user("allmende: project %s has no GPU-hours left (example rejection)",
    tostring(job_desc.account or job_desc.default_account))
  return slurm.ESLURM_ACCOUNTING_POLICY or slurm.ERROR
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  return slurm.SUCCESS
end

return slurm.SUCCESS
