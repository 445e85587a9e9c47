--[[
Example job_submit/lua script for the local test Slurm (infra/slurm): NOT the Allmende plugin.

slurmctld loads job_submit.lua from the directory of slurm.conf (infra/slurm/start.sh copies
this file there when JobSubmitPlugins=lua) and reloads it when its mtime changes.
Debian 12's job_submit_lua.so links liblua5.1: modules come from lua-socket / lua-cjson's
5.1 paths (/usr/share/lua/5.1, /usr/lib/x86_64-linux-gnu/lua/5.1), found by the default
package.path / package.cpath.

  * logs every submission (slurmctld.log, "job_submit.lua: ...")
  * rejects a job whose --comment starts with "allmende:reject", with a message to the user
  * probes at load time whether socket.http and cjson can be required
]]

local function probe(name)
  local ok, mod = pcall(require, name)
  if ok then
    slurm.log_info("job_submit.lua: require(%q) ok", name)
  else
    slurm.log_error("job_submit.lua: require(%q) failed: %s", name, tostring(mod))
  end
  return ok and mod or nil
end

local http = probe("socket.http")
local cjson = probe("cjson")
if http and cjson then
  slurm.log_info("job_submit.lua: socket.http %s, cjson %s, %s",
    tostring(http.USERAGENT), tostring(cjson._VERSION), _VERSION)
end

local function s(v)
  if v == nil then return "-" end
  return tostring(v)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  slurm.log_info(
    "job_submit.lua: submit uid=%s user=%s account=%s partition=%s qos=%s " ..
    "tres_per_node=%s tres_per_job=%s time_limit=%s priority=%s comment=%s name=%s " ..
    "default_account=%s default_qos=%s NO_VAL=%s",
    s(submit_uid), s(job_desc.user_name), s(job_desc.account), s(job_desc.partition),
    s(job_desc.qos), s(job_desc.tres_per_node), s(job_desc.tres_per_job),
    s(job_desc.time_limit), s(job_desc.priority), s(job_desc.comment), s(job_desc.name),
    s(job_desc.default_account), s(job_desc.default_qos), s(slurm.NO_VAL))

  if job_desc.comment ~= nil and string.find(job_desc.comment, "^allmende:reject") then
    slurm.log_user("allmende: job rejected by the example job_submit.lua (comment %s)",
      job_desc.comment)
    return slurm.ERROR
  end
  return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  slurm.log_info("job_submit.lua: modify job %s uid=%s", s(job_rec.job_id), s(modify_uid))
  return slurm.SUCCESS
end

slurm.log_info("job_submit.lua: example loaded")
return slurm.SUCCESS
