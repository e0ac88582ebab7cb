package io.jsetl.yarn;

import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;
import org.apache.hadoop.yarn.server.nodemanager.NodeManager;

/**
 * Hadoop's MiniYARNCluster (one ResourceManager, one NodeManager) as a process of its own, for
 * the tests: tools/yarn.py starts it and stops it by pid (SIGTERM: the shutdown hook stops the
 * cluster, whose NodeManager kills the containers still running).
 *
 * <p>Usage: {@code MiniYarnLauncher WORK_DIR CONF_DIR MEMORY_MB VCORES DELETE_DELAY_S}. Every
 * port is the kernel's choice (":0", the MiniYARNCluster's default) and bound on 127.0.0.1 only;
 * the cluster's files live under WORK_DIR (the JVM's {@code test.build.data}, set by the
 * caller). Once the NodeManager has registered, the effective configuration is written into
 * CONF_DIR as yarn-site.xml and core-site.xml (a HADOOP_CONF_DIR for spark-submit), then
 * WORK_DIR/ready.json (the addresses and the NodeManager's directories). It runs until killed.
 */
public final class MiniYarnLauncher {
    private MiniYarnLauncher() {}

    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: MiniYarnLauncher WORK_DIR CONF_DIR MEMORY_MB VCORES "
                + "DELETE_DELAY_S");
            System.exit(2);
        }
        Path work = Paths.get(args[0]).toAbsolutePath();
        Path confDir = Paths.get(args[1]).toAbsolutePath();
        int memoryMb = Integer.parseInt(args[2]);
        int vcores = Integer.parseInt(args[3]);
        int deleteDelay = Integer.parseInt(args[4]);

        YarnConfiguration conf = new YarnConfiguration();
        conf.set("fs.defaultFS", "file:///");
        // Ports: the MiniYARNCluster sets every address to localhost:0 (it is not told
        // yarn.minicluster.fixed.ports) and the services write the bound port back into the
        // configuration; bind-host keeps the listeners on the loopback interface.
        conf.set("yarn.resourcemanager.bind-host", "127.0.0.1");
        conf.set("yarn.nodemanager.bind-host", "127.0.0.1");
        // What the node offers. The MiniYARNCluster overwrites the NodeManager's memory with its
        // own key (default 4096), so both are set.
        conf.setInt("yarn.minicluster.yarn.nodemanager.resource.memory-mb", memoryMb);
        conf.setInt("yarn.nodemanager.resource.memory-mb", memoryMb);
        conf.setInt("yarn.nodemanager.resource.cpu-vcores", vcores);
        conf.setInt("yarn.scheduler.minimum-allocation-mb", 128);
        conf.setInt("yarn.scheduler.maximum-allocation-mb", memoryMb);
        conf.setInt("yarn.scheduler.minimum-allocation-vcores", 1);
        conf.setInt("yarn.scheduler.maximum-allocation-vcores", vcores);
        // The capacity scheduler's default queue gives application masters 10 % of the node:
        // too little for a Spark driver in cluster mode beside another application's.
        conf.setFloat("yarn.scheduler.capacity.maximum-am-resource-percent", 0.5f);
        // A small machine: no memory policing of the containers (the MiniYARNCluster turns the
        // container monitor off too), no node marked unhealthy for a full or slow disk.
        conf.setBoolean("yarn.nodemanager.pmem-check-enabled", false);
        conf.setBoolean("yarn.nodemanager.vmem-check-enabled", false);
        conf.setBoolean("yarn.nodemanager.disk-health-checker.enable", false);
        conf.setFloat(
            "yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage",
            100.0f);
        conf.setLong("yarn.nodemanager.disk-health-checker.min-free-space-per-disk-mb", 0);
        // Keep every container's files (its launch_container.sh among them) after the
        // application ends, for the tests to read what a container was started with.
        conf.setInt("yarn.nodemanager.delete.debug-delay-sec", deleteDelay);
        conf.set("yarn.nodemanager.log-container-debug-info.enabled", "true");
        // Application history: the ResourceManager's own memory is enough for the REST API.
        conf.setBoolean("yarn.timeline-service.enabled", false);

        MiniYARNCluster cluster = new MiniYARNCluster("js-etl", 1, 1, 1);
        Runtime.getRuntime().addShutdownHook(new Thread(cluster::stop, "mini-yarn-stop"));
        cluster.init(conf);
        cluster.start();
        while (!cluster.waitForNodeManagersToConnect(10_000)) {
            System.err.println("MiniYarnLauncher: waiting for the NodeManager to register");
        }

        Configuration effective = cluster.getConfig();
        Files.createDirectories(confDir);
        writeXml(effective, confDir.resolve("yarn-site.xml"));
        Configuration core = new Configuration(false);
        core.set("fs.defaultFS", "file:///");
        writeXml(core, confDir.resolve("core-site.xml"));

        NodeManager nm = cluster.getNodeManager(0);
        Configuration nmConf = nm.getConfig();
        StringBuilder ready = new StringBuilder("{");
        field(ready, "rm_address", effective.get("yarn.resourcemanager.address")).append(',');
        field(ready, "rm_scheduler_address",
            effective.get("yarn.resourcemanager.scheduler.address")).append(',');
        field(ready, "rm_resource_tracker_address",
            effective.get("yarn.resourcemanager.resource-tracker.address")).append(',');
        field(ready, "rm_admin_address",
            effective.get("yarn.resourcemanager.admin.address")).append(',');
        field(ready, "rm_webapp_address",
            effective.get("yarn.resourcemanager.webapp.address")).append(',');
        field(ready, "nm_address", nm.getNMContext().getNodeId().toString()).append(',');
        field(ready, "nm_http_port", Integer.toString(nm.getNMContext().getHttpPort()))
            .append(',');
        field(ready, "nm_local_dirs", nmConf.get("yarn.nodemanager.local-dirs")).append(',');
        field(ready, "nm_log_dirs", nmConf.get("yarn.nodemanager.log-dirs")).append(',');
        field(ready, "work_dir", cluster.getTestWorkDir().getAbsolutePath());
        ready.append("}\n");
        Path tmp = work.resolve("ready.json.tmp");
        Files.writeString(tmp, ready.toString(), StandardCharsets.UTF_8);
        Files.move(tmp, work.resolve("ready.json"), StandardCopyOption.ATOMIC_MOVE);
        System.err.println("MiniYarnLauncher: ready " + ready.toString().trim());

        Thread.currentThread().join();
    }

    private static void writeXml(Configuration conf, Path target) throws IOException {
        Path tmp = target.resolveSibling(target.getFileName() + ".tmp");
        try (OutputStream out = Files.newOutputStream(tmp)) {
            conf.writeXml(out);
        }
        Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE);
    }

    private static StringBuilder field(StringBuilder json, String name, String value) {
        json.append('"').append(name).append("\":\"");
        for (char c : String.valueOf(value).toCharArray()) {
            if (c == '"' || c == '\\') {
                json.append('\\');
            }
            json.append(c);
        }
        return json.append('"');
    }
}
