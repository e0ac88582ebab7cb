package io.jsetl.yarn;

import java.io.FileOutputStream;
import java.io.OutputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;

/**
 * Hadoop's MiniYARNCluster (one ResourceManager, one NodeManager) as a process for the tests
 * (tools/yarn.py starts and stops it). Every port is chosen free by the cluster itself; once the
 * NodeManager has registered, the effective configuration is written as yarn-site.xml and
 * core-site.xml into args[0] (a HADOOP_CONF_DIR for spark-submit), then a file "ready". It runs
 * until killed.
 */
public final class MiniYarn {
    public static void main(String[] args) throws Exception {
        Path confDir = Paths.get(args[0]);
        int memoryMb = Integer.parseInt(args[1]);
        YarnConfiguration conf = new YarnConfiguration();
        conf.setInt(YarnConfiguration.NM_PMEM_MB, memoryMb);
        conf.setInt(YarnConfiguration.NM_VCORES, 4);
        conf.setInt(YarnConfiguration.RM_SCHEDULER_MINIMUM_ALLOCATION_MB, 128);
        conf.setInt(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_MB, memoryMb);
        // A small box: no memory policing of containers, no disk-full refusal of the node.
        conf.setBoolean(YarnConfiguration.NM_PMEM_CHECK_ENABLED, false);
        conf.setBoolean(YarnConfiguration.NM_VMEM_CHECK_ENABLED, false);
        conf.setFloat(YarnConfiguration.NM_MAX_PER_DISK_UTILIZATION_PERCENTAGE, 100.0f);
        conf.setBoolean(YarnConfiguration.NM_DISK_HEALTH_CHECK_ENABLE, false);
        // Keep each container's launch script and working directory after the application, for
        // the tests to read what it was started with.
        conf.setInt(YarnConfiguration.DEBUG_NM_DELETE_DELAY_SEC, 3600);
        // The capacity scheduler's default leaves 10 % of the cluster to application masters.
        conf.setFloat("yarn.scheduler.capacity.maximum-am-resource-percent", 1.0f);
        conf.set("fs.defaultFS", "file:///");

        MiniYARNCluster cluster = new MiniYARNCluster("js-etl", 1, 1, 1);
        cluster.init(conf);
        cluster.start();
        if (!cluster.waitForNodeManagersToConnect(120_000)) {
            throw new IllegalStateException("the NodeManager did not register in 120 s");
        }
        Configuration effective = cluster.getConfig();
        Files.createDirectories(confDir);
        try (OutputStream out = new FileOutputStream(confDir.resolve("yarn-site.xml").toFile())) {
            effective.writeXml(out);
        }
        Configuration core = new Configuration(false);
        core.set("fs.defaultFS", "file:///");
        try (OutputStream out = new FileOutputStream(confDir.resolve("core-site.xml").toFile())) {
            core.writeXml(out);
        }
        Files.writeString(confDir.resolve("ready"),
            effective.get(YarnConfiguration.RM_WEBAPP_ADDRESS) + "\n");
        Thread.currentThread().join();
    }
}
