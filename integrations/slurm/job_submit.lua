--[[
Allmende's job_submit/lua plugin: runs inside slurmctld, holding its job write lock, at every
submission, so it asks nobody: no network round trip, only local checks (well under a millisecond).

A GPU job arrives either with an admission ticket (`allmende-ticket:<ticket>` in its comment, put
there by cli_filter.lua, which asked the admission API from the user's own sbatch/salloc/srun) or
without one. The ticket is the API's decision, signed with HMAC-SHA256 (domain/admission_tickets.py
says the format). This plugin checks it with the same key (`ticket_key_file`):

  valid, unexpired, never used before, for exactly what the job asks (project, user, cluster, GPU
  type and count, priority class, interactive, requested hours):
    admit -> the job is submitted tagged `allmende:<id>` (admin_comment, or comment: `id_field`);
             in the opportunistic lane its QOS becomes `preemptible_qos`
    queue -> the job is submitted held (priority 0), its request stored next to its id
             (`allmende-request:<JSON>`), for the agent (integrations/slurm/agent.py) to admit
  anything else (no ticket, forged, altered, expired, reused, for another job's request, a dry-run
  ticket): the job is submitted held the same way under a new admission id, and the agent asks
  the API about it. So no GPU job starts without an admission: cli_filter is a convenience (the
  verdict and its sentence at once), this plugin and the agent are the guarantee.

The plugin's hold cannot be lifted by the job's owner: `slurm_job_modify` refuses, for anyone but
`privileged_uids` (root; add SlurmUser and the agent's uid), raising the priority of a held job and
changing what an admitted job asks for (account, partition, QOS, GPUs, nodes, tasks, time limit).

`dry_run`: checks tickets and logs what it would do, changing nothing in the job (the ticket text is
taken out of its comment). Jobs without GPUs are not touched. Ticket ids are remembered until they
expire, in memory and in `<spool_dir>/used-tickets` (so a restarted slurmctld still refuses a
replay).

Needs lua-cjson and lua-luaossl (HMAC), Lua 5.1 builds, and allmende_slurm.lua next to this file.
]]

local PREFIX = "allmende: "
local function log_info(fmt, ...) slurm.log_info(PREFIX .. fmt, ...) end
local function log_error(fmt, ...) slurm.log_error(PREFIX .. fmt, ...) end

-- This file's directory (slurm.conf's), where allmende_slurm.lua is: "@/etc/slurm/x.lua" -> "/etc/slurm".
local SCRIPT_DIR = (debug.getinfo(1, "S").source or ""):match("^@(/.*)/[^/]*$")
local ok_a, A = pcall(dofile, (SCRIPT_DIR or ".") .. "/allmende_slurm.lua")
if not ok_a then
  log_error("allmende_slurm.lua could not be loaded (%s): every GPU job is held", tostring(A))
  A = nil
end
local ok_hmac, hmac = pcall(require, "openssl.hmac")
if not ok_hmac then
  log_error("lua-luaossl is missing (%s): no ticket can be checked, every GPU job is held", tostring(hmac))
  hmac = nil
end

-- -- the job ---------------------------------------------------------------------------------

local function default_partition(part_list, cfg)
  if type(part_list) == "table" then
    for name, part in pairs(part_list) do
      local ok, flag = pcall(function() return part.flag_default end)
      if ok and (flag == 1 or flag == true) then
        local ok2, pname = pcall(function() return part.name end)
        return (ok2 and pname) or name
      end
    end
  end
  return cfg.default_partition
end

-- Total GPUs and the Slurm GPU type (nil: untyped) the job asks for.
local function job_gpus(job_desc)
  local n, t = A.gpus_in(job_desc.tres_per_job)
  if n > 0 then return n, t end
  local nodes = job_desc.min_nodes
  if A.unset(nodes) or nodes < 1 then nodes = 1 end
  n, t = A.gpus_in(job_desc.tres_per_node)
  if n > 0 then return n * nodes, t end
  n, t = A.gpus_in(job_desc.tres_per_task)
  if n > 0 then
    local tasks = job_desc.num_tasks
    if A.unset(tasks) or tasks < 1 then tasks = 1 end
    return n * tasks, t
  end
  n, t = A.gpus_in(job_desc.tres_per_socket)
  if n > 0 then
    local sockets = job_desc.sockets_per_node
    if A.unset(sockets) or sockets < 1 then sockets = 1 end
    return n * sockets * nodes, t
  end
  return 0, nil
end

local function facts_of(job_desc, part_list, submit_uid, cfg)
  local gpus, slurm_type = job_gpus(job_desc)
  local user = job_desc.user_name
  if user == nil or user == "" then user = "uid" .. tostring(job_desc.user_id or submit_uid) end
  local limit = job_desc.time_limit
  return {
    account = job_desc.account or job_desc.default_account,
    partition = A.first_of_list(job_desc.partition) or default_partition(part_list, cfg),
    qos = job_desc.qos or job_desc.default_qos,
    gpus = gpus, slurm_type = slurm_type,
    interactive = job_desc.script == nil,
    time_minutes = (not A.unset(limit)) and limit or nil,
    user = user,
  }
end

-- -- tickets ---------------------------------------------------------------------------------

local used = nil -- admission id -> expiry, of every ticket a job was submitted with
local used_count = 0

local function used_file(cfg)
  return tostring(cfg.spool_dir) .. "/used-tickets"
end

local function load_used(cfg, now)
  used, used_count = {}, 0
  local text = A.read_file(used_file(cfg))
  if text == nil then return end
  for id, exp in text:gmatch("(%S+) (%d+)\n") do
    if tonumber(exp) >= now and used[id] == nil then
      used[id] = tonumber(exp)
      used_count = used_count + 1
    end
  end
end

-- Remember `id` until `exp`; rewrite the file without the expired ones once it has grown.
local function remember(cfg, id, exp, now)
  used[id] = exp
  used_count = used_count + 1
  local path = used_file(cfg)
  if used_count > 1000 and used_count % 1000 == 0 then
    local live, lines = 0, {}
    for k, v in pairs(used) do
      if v >= now then lines[#lines + 1] = k .. " " .. v .. "\n"; live = live + 1 else used[k] = nil end
    end
    used_count = live
    local f = io.open(path .. ".tmp", "wb")
    if f then
      f:write(table.concat(lines)); f:close()
      os.rename(path .. ".tmp", path)
      return
    end
  end
  local f = io.open(path, "ab")
  if f == nil then
    log_error("cannot write %s: a replayed ticket is refused only until slurmctld restarts", path)
    return
  end
  f:write(id .. " " .. exp .. "\n")
  f:close()
end

local FIELDS = { "project", "user", "cluster", "gpu_type", "gpus", "priority_class", "interactive" }

-- The ticket's payload if it is valid for this job, else nil and why not.
local function check(text, body, extra, cfg, now)
  if text == nil then
    return nil, "it was submitted without an admission (cli_filter not in use, or the API could not be asked)"
  end
  if hmac == nil or A.cjson == nil then return nil, "lua-luaossl or lua-cjson is missing here" end
  if cfg.ticket_key == nil or cfg.ticket_key == "" then return nil, "this cluster has no ticket key (ticket_key_file)" end
  local version, hexed, mac = text:match("^(v1)%.(%x+)%.(%x+)$")
  if version == nil then return nil, "its admission ticket is malformed" end
  local expected = A.hex_encode(hmac.new(cfg.ticket_key, "sha256"):final(hexed))
  if expected ~= mac:lower() then
    return nil, "its admission ticket's signature is wrong (forged or altered)"
  end
  local ok, t = pcall(A.cjson.decode, A.hex_decode(hexed) or "")
  if not ok or type(t) ~= "table" then return nil, "its admission ticket cannot be read" end
  if t.dry == true then return t, "its admission ticket is from a dry run" end
  if tonumber(t.exp) == nil or tonumber(t.exp) + cfg.ticket_leeway_s < now then
    return nil, "its admission ticket has expired"
  end
  for _, f in ipairs(FIELDS) do
    if t[f] ~= body[f] then
      return nil, string.format("its admission ticket is for %s %s, the job asks for %s", f, tostring(t[f]),
        tostring(body[f]))
    end
  end
  if t.requested_seconds ~= extra.requested_seconds then
    return nil, string.format("its admission ticket is for %s s, the job asks for %s s",
      tostring(t.requested_seconds), tostring(extra.requested_seconds))
  end
  if used == nil then load_used(cfg, now) end
  if used[t.id] ~= nil then
    return nil, string.format("its admission ticket (%s) was used by another job already", tostring(t.id))
  end
  return t, nil
end

-- Take the ticket out of the comment (it is for this plugin only); the ticket text or nil.
local function take_ticket(job_desc)
  local c = job_desc.comment
  if c == nil or c == "" then return nil end
  local s = c:find(A.TICKET_MARK, 1, true)
  if s == nil then return nil end
  local e = (c:find("%s", s) or (#c + 1)) - 1
  local ticket = c:sub(s + #A.TICKET_MARK, e)
  local rest = (c:sub(1, s - 1) .. c:sub(e + 1)):gsub("^%s+", ""):gsub("%s+$", "")
  job_desc.comment = rest -- "" clears it (slurmctld takes no nil here)
  return ticket
end

-- -- acting ----------------------------------------------------------------------------------

-- `extra` (one word, no spaces) follows the tag: a held job's request, for the agent.
local function tag_job(job_desc, cfg, admission_id, note, extra)
  local tag = "allmende:" .. admission_id
  if extra then tag = tag .. " " .. extra end
  if cfg.id_field == "comment" then
    local c = job_desc.comment
    local text = tag
    if note then text = text .. " " .. note end
    if c and c ~= "" then text = text .. " " .. c end
    job_desc.comment = text
  else
    local a = job_desc.admin_comment
    job_desc.admin_comment = (a and a ~= "") and (tag .. " " .. a) or tag
    if note then
      local c = job_desc.comment
      job_desc.comment = (c and c ~= "") and (note .. " " .. c) or note
    end
  end
end

-- Submitted held (priority 0) with its request next to its id: the agent asks the API again
-- with exactly this request (compact JSON: no spaces, no "=").
local function hold(job_desc, cfg, body, note)
  local stored = nil
  local ok, encoded = pcall(A.cjson.encode, body)
  if ok and type(encoded) == "string" and not encoded:find("[%s=]") then
    stored = "allmende-request:" .. encoded
  end
  tag_job(job_desc, cfg, body.job_id, "allmende: queued: " .. note, stored)
  job_desc.priority = 0
end

function slurm_job_submit(job_desc, part_list, submit_uid)
  if A == nil then
    job_desc.priority = 0
    slurm.log_user("allmende: the job is held: the GPU budget plugin is not installed completely")
    return slurm.SUCCESS
  end
  local cfg, problem = A.load_config(SCRIPT_DIR)
  if problem then log_error("%s; using %s", problem, cfg._path and ("the configuration read before from " .. cfg._path) or "the defaults") end
  local ticket_text = take_ticket(job_desc)
  local ok, facts = pcall(facts_of, job_desc, part_list, submit_uid, cfg)
  if not ok then
    log_error("job %s: could not be read (%s): held", tostring(job_desc.name), tostring(facts))
    job_desc.priority = 0
    return slurm.SUCCESS
  end
  local body, extra = A.request(facts, cfg)
  if body == nil then return slurm.SUCCESS end -- no GPUs: nothing to budget
  local now = os.time()
  local t, why = check(ticket_text, body, extra, cfg, now)
  if t ~= nil and why == nil then body.job_id = t.id end
  local label = A.label(body) .. " of " .. tostring(facts.user)

  if cfg.dry_run == true then
    if t ~= nil then
      local lane = A.is_null(t.lane) and "none" or tostring(t.lane)
      local action = ({
        reject = "reject the job",
        queue = "hold the job (priority 0)",
        admit = (lane == "opportunistic" and cfg.preemptible_qos)
          and ("admit it with QOS " .. tostring(cfg.preemptible_qos)) or "admit it",
      })[tostring(t.verdict)] or tostring(t.verdict)
      log_info("dry-run: %s: ticket verdict %s, lane %s: would %s", label, tostring(t.verdict), lane, action)
    else
      log_info("dry-run: %s: would hold the job for the agent: %s", label, why)
    end
    return slurm.SUCCESS
  end

  if t == nil or why ~= nil then
    hold(job_desc, cfg, body, "held until the GPU budget service admits it: " .. why)
    log_info("%s: submitted held for the agent: %s", label, why)
    slurm.log_user("allmende: the job is held until the GPU budget service admits it: %s.", why)
    return slurm.SUCCESS
  end
  remember(cfg, t.id, tonumber(t.exp) + cfg.ticket_leeway_s, now)
  if t.verdict == "queue" then
    hold(job_desc, cfg, body, "the GPU budget service queued it; the agent asks again")
    log_info("%s: queued (ticket): submitted held", label)
    return slurm.SUCCESS
  end
  if t.verdict ~= "admit" then
    hold(job_desc, cfg, body, "its admission ticket says " .. tostring(t.verdict))
    log_info("%s: ticket verdict %s: submitted held", label, tostring(t.verdict))
    return slurm.SUCCESS
  end
  tag_job(job_desc, cfg, t.id, nil)
  local lane = A.is_null(t.lane) and "none" or tostring(t.lane)
  if lane == "opportunistic" and cfg.preemptible_qos and cfg.preemptible_qos ~= "" and
      extra.qos ~= cfg.preemptible_qos then
    job_desc.qos = cfg.preemptible_qos
    log_info("%s: admitted (ticket) in the opportunistic lane; QOS %s -> %s", label, tostring(extra.qos),
      tostring(cfg.preemptible_qos))
  else
    log_info("%s: admitted (ticket, lane %s)", label, lane)
  end
  return slurm.SUCCESS
end

-- What an owner may not change on an Allmende job: its hold, and what its admission was for.
local GUARDED = { "account", "partition", "qos", "tres_per_job", "tres_per_node", "tres_per_task",
                  "tres_per_socket", "min_nodes", "num_tasks", "time_limit" }

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
  if A == nil then return slurm.SUCCESS end
  local cfg = A.load_config(SCRIPT_DIR)
  if A.contains(cfg.privileged_uids, modify_uid) then return slurm.SUCCESS end
  local tags = (cfg.id_field == "comment") and job_rec.comment or job_rec.admin_comment
  if tags == nil or not tags:find("allmende:", 1, true) then return slurm.SUCCESS end
  local denied = nil
  local asked = job_desc.priority -- INFINITE: `scontrol release`; NO_VAL: not changed
  if job_rec.priority == 0 and tags:find("allmende-request:", 1, true) and
      asked ~= nil and asked ~= A.NO_VAL and asked ~= 0 then
    denied = "it is held until the GPU budget service admits it"
  else
    for _, f in ipairs(GUARDED) do
      local v = job_desc[f]
      if v ~= nil and not A.unset(v) and v ~= "" then
        denied = "its admission was for what it asked at submission (" .. f .. ")"
        break
      end
    end
  end
  if denied then
    log_info("job %s: change by uid %s refused: %s", tostring(job_rec.job_id), tostring(modify_uid), denied)
    slurm.log_user("allmende: refused: %s", denied)
    return slurm.ESLURM_ACCESS_DENIED or slurm.ERROR
  end
  return slurm.SUCCESS
end

log_info("job_submit.lua loaded (allmende_slurm.lua %s, luaossl %s)", A and "ok" or "MISSING",
  hmac and "ok" or "MISSING")
return slurm.SUCCESS
